//! `Cluster`: the handle a program uses to submit tasks and put, get, wait
//! for and cancel objects; `init` makes one, embedded or joined.
//!
//! Beside it: `config.rs` (how `init` starts or joins a cluster),
//! `start.rs` (a driver's start: the cluster it embeds or joins, its core
//! and its owner service), `embedded.rs` (the head and node an embedded
//! cluster runs in this process, feature `embedded`; `no_embedded.rs`
//! stands in without it), `session.rs` (the session directory that `raylet start`
//! writes and a joining driver reads) and `kv.rs` (the cluster's key-value
//! store, as `Cluster` methods).

pub(crate) mod config;
#[cfg(feature = "embedded")]
mod embedded;
#[cfg(not(feature = "embedded"))]
#[path = "no_embedded.rs"]
mod embedded;
pub(crate) mod kv;
pub mod session;
mod start;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use raylet_cluster_status::ClusterStatus;
use raylet_proto::{JobId, ObjectId, TaskId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

use crate::cluster::config::Config;
use crate::cluster::embedded::Embedded;
use crate::core_worker::CoreWorker;
use crate::generator::{Caller, ObjectRefStream};
use crate::objects::archived::{Archivable, ArchivedRef, Checkable};
use crate::objects::object_ref::handle::{AnyObjectRef, ObjectRef, RawRef};
use crate::objects::shared_objects::store_error;
use crate::observability::memory::NodeMemory;
use crate::submitter::pending_gate::{DEFAULT_MAX_PENDING_TASKS, PendingGate, PendingPermit};
use crate::submitter::task::{Arg, TaskOptions};
use crate::submitter::{QueuedOptions, SchedulingClass, Submission, SubmitterEvent, TaskTemplate, TemplateCache};
use crate::value::{Body, EncodedValue, Format, collecting_refs};
use crate::{Error, Result};

static CURRENT: RwLock<Option<Cluster>> = RwLock::new(None);

/// Starts an embedded cluster, or joins the one at `RAYLET_ADDRESS`. Calling
/// it again returns the same cluster.
pub fn init() -> Result<Cluster> {
    init_with(Config::from_env())
}

/// Like [`init`], with explicit settings.
pub fn init_with(config: Config) -> Result<Cluster> {
    if let Ok(cluster) = current() {
        return Ok(cluster);
    }
    let cluster = Cluster::start(config)?;
    set_current(cluster.clone());
    Ok(cluster)
}

/// The cluster of this process: the one `init` made, or in a task, the
/// cluster the task runs in.
pub fn current() -> Result<Cluster> {
    CURRENT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(Error::NotInitialized)
}

pub(crate) fn set_current(cluster: Cluster) {
    crate::observability::timeline::set_job(cluster.job_id());
    *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(cluster);
}

/// A handle to a running cluster. Clones share it.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<ClusterInner>,
}

struct ClusterInner {
    core: Arc<CoreWorker>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    embedded: Mutex<Option<Embedded>>,
    owner_services: Mutex<Option<start::OwnerServices>>,
    /// The shared options of the tasks this process submits.
    templates: TemplateCache,
    /// Its tasks and actor calls submitted and not finished.
    pending: Arc<PendingGate>,
}

impl Cluster {
    /// Joins the running cluster whose head is at `address`.
    pub fn connect(address: &str) -> Result<Cluster> {
        init_with(Config::from_env().address(address))
    }

    /// The IP address this process serves other processes on: where peers
    /// that talk to it directly (the ranks of a collective group) reach it.
    pub fn node_ip(&self) -> std::net::IpAddr {
        let address: Option<std::net::SocketAddr> = self.core().ctx().address.parse().ok();
        address.map_or(std::net::Ipv4Addr::LOCALHOST.into(), |address| address.ip())
    }

    /// Where the cluster's head listens (`HOST:PORT`): the address that
    /// `raylet status --address`, the dashboard (`raylet_dashboard`) and
    /// other programs joining the cluster take.
    pub fn head_address(&self) -> String {
        self.core().ctx().head_address.clone()
    }

    /// The cluster token: the dashboard's login and API take it.
    pub fn token(&self) -> String {
        self.core().ctx().token.expose().to_string()
    }

    /// The job this program's tasks are recorded under: `raylet list tasks`
    /// and `raylet timeline --job` take it.
    pub fn job_id(&self) -> JobId {
        self.core().owner.task_events.job()
    }

    pub(crate) fn for_worker(core: Arc<CoreWorker>) -> Cluster {
        Cluster {
            inner: Arc::new(ClusterInner {
                core,
                runtime: Mutex::new(None),
                embedded: Mutex::new(None),
                owner_services: Mutex::new(None),
                templates: TemplateCache::default(),
                pending: PendingGate::new(DEFAULT_MAX_PENDING_TASKS),
            }),
        }
    }

    fn start(config: Config) -> Result<Cluster> {
        let pending = PendingGate::new(config.max_pending_tasks);
        if let Some(files) = &config.tls {
            raylet_common::tls::configure(Some(files.clone()))?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads)
            .thread_name("raylet")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let started = std::thread::scope(|scope| {
            scope
                .spawn(|| runtime.block_on(start::start_driver(config, handle)))
                .join()
                .unwrap_or_else(|_| Err(Error::Cluster(raylet_proto::Error::Internal("start panicked".into()))))
        })?;
        Ok(Cluster {
            inner: Arc::new(ClusterInner {
                core: started.core,
                runtime: Mutex::new(Some(runtime)),
                embedded: Mutex::new(started.embedded),
                owner_services: Mutex::new(Some(started.owner_services)),
                templates: TemplateCache::default(),
                pending,
            }),
        })
    }

    pub(crate) fn core(&self) -> &Arc<CoreWorker> {
        &self.inner.core
    }

    /// A place for one more pending task or actor call, once there is room.
    pub(crate) fn admit_pending(&self) -> PendingPermit {
        self.inner.pending.admit()
    }

    /// Submits a call of a remote function; `#[raylet::remote]` calls this.
    pub fn submit_task<R>(&self, options: TaskOptions, args: Vec<Arg>) -> Result<ObjectRef<R>> {
        let (_, mut returns) = self.enqueue_task(options.num_returns(1), args)?;
        Ok(returns.remove(0).typed())
    }

    /// Submits a call of a remote function that returns several values
    /// (`num_returns`): one reference to each, in order.
    pub fn submit_task_returns(&self, options: TaskOptions, args: Vec<Arg>) -> Result<Vec<AnyObjectRef>> {
        Ok(self.enqueue_task(options, args)?.1)
    }

    /// Submits a call of a generator function: its items stream back as it
    /// yields them.
    pub fn submit_generator<T>(&self, options: TaskOptions, args: Vec<Arg>) -> Result<ObjectRefStream<T>> {
        let options = options.num_returns(1).generator();
        let (task_id, returns) = self.enqueue_task(options, args)?;
        Ok(ObjectRefStream::of_call(self.core(), task_id, returns, Caller::Task))
    }

    /// Queues a task with the submitter; its return objects (and a
    /// generator's stream) exist before it is sent.
    fn enqueue_task(&self, options: TaskOptions, args: Vec<Arg>) -> Result<(TaskId, Vec<AnyObjectRef>)> {
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerSubmits);
        let class = SchedulingClass {
            demand: options.demand()?,
            scheduling: options.scheduling.to_scheduling()?,
        };
        let generator = options.generator;
        let num_returns = options.num_returns;
        let template = TaskTemplate {
            options: QueuedOptions::new(options),
            class,
            job: self.core().owner.task_events.job(),
        };
        let template = self
            .inner
            .templates
            .intern(&template, |template| Arc::new(template.clone()));
        let permit = self.admit_pending();
        let core = self.core();
        let task_id = TaskId::random();
        let returns = self.pending_returns(task_id, num_returns);
        if let Some(backpressure) = generator {
            core.owner.generators.open(task_id, backpressure);
        }
        let submission = Submission {
            task_id,
            template,
            args,
            permit,
        };
        core.submitter
            .handle_now(SubmitterEvent::Submit(Box::new(submission)))
            .map_err(|_| shut_down())?;
        Ok((task_id, returns))
    }

    /// References to the `count` objects a call `task_id` returns, pending.
    pub(crate) fn pending_returns(&self, task_id: TaskId, count: u32) -> Vec<AnyObjectRef> {
        (0..u64::from(count))
            .map(|index| {
                self.core().owner.store.add_pending(task_id.object_at(index));
                self.owned_ref(task_id.object_at(index))
            })
            .collect()
    }

    pub(crate) fn owned_ref(&self, id: ObjectId) -> AnyObjectRef {
        let core = self.core();
        AnyObjectRef::owned(
            RawRef {
                id,
                owner: core.ctx().address.clone(),
            },
            &core.owner.store,
        )
    }

    /// Stores a value in the cluster and returns a reference to it. Values
    /// of [`crate::INLINE_LIMIT`] bytes and more are written once, straight
    /// into this node's shared-memory store; smaller ones stay here. When
    /// the store stays full past the store-full timeout, this fails with
    /// `Error::ObjectStoreFull`.
    pub fn put<T: Serialize>(&self, value: &T) -> Result<ObjectRef<T>> {
        let core = self.core();
        let id = ObjectId::random();
        let size = raylet_common::codec::encoded_len(value)?;
        let (body, contained) = collecting_refs(|| -> Result<Body> {
            if size < crate::INLINE_LIMIT {
                let mut data = vec![0; size];
                raylet_common::codec::encode_into(value, &mut data)?;
                return Ok(Body::Inline(data.into()));
            }
            let encode = |out: &mut [u8]| Ok(raylet_common::codec::encode_into(value, out)?);
            Ok(Body::Stored(core.shared_objects.write_object(
                id,
                size,
                core.ctx().address.clone(),
                encode,
            )?))
        });
        core.owner
            .store
            .insert(id, EncodedValue::new::<T>(Format::Postcard, body?, contained));
        Ok(self.owned_ref(id).typed())
    }

    /// Stores a value as an rkyv archive, read in place by
    /// [`ObjectRef::get_archived`]: on this node, a large value is written
    /// once into shared memory and every reader maps those same pages.
    pub fn put_archived<T: Archivable>(&self, value: &T) -> Result<ObjectRef<T>> {
        use raylet_object_store::archive::{archive_into, archived_len};
        let core = self.core();
        let id = ObjectId::random();
        let size = archived_len(value).map_err(store_error)?;
        let body = if size < crate::INLINE_LIMIT {
            let mut data = rkyv::util::AlignedVec::<16>::with_capacity(size);
            data.resize(size, 0);
            archive_into(value, &mut data).map_err(store_error)?;
            Body::Inline(bytes::Bytes::copy_from_slice(&data))
        } else {
            let archive = |out: &mut [u8]| archive_into(value, out).map_err(store_error);
            Body::Stored(
                core.shared_objects
                    .write_object(id, size, core.ctx().address.clone(), archive)?,
            )
        };
        core.owner
            .store
            .insert(id, EncodedValue::new::<T>(Format::Archive, body, Vec::new()));
        Ok(self.owned_ref(id).typed())
    }

    /// Waits for the object and returns its value, or its task's error.
    pub fn get<T: DeserializeOwned>(&self, object: &ObjectRef<T>) -> Result<T> {
        let outcome = self.core().wait_outcome_blocking(object.as_untyped(), None)?;
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerWoke);
        let value = self
            .core()
            .shared_objects
            .decode_blocking(object.as_untyped().raw(), outcome.expect("waiting without a timeout"));
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerGot);
        value
    }

    /// Like [`Cluster::get`], but fails with `Error::GetTimeout` after `timeout`.
    pub fn get_timeout<T: DeserializeOwned>(&self, object: &ObjectRef<T>, timeout: Duration) -> Result<T> {
        match self.core().wait_outcome_blocking(object.as_untyped(), Some(timeout))? {
            Some(outcome) => self
                .core()
                .shared_objects
                .decode_blocking(object.as_untyped().raw(), outcome),
            None => Err(Error::GetTimeout {
                object: object.id(),
                timeout,
            }),
        }
    }

    /// Waits for the object without blocking a thread.
    pub async fn get_async<T: DeserializeOwned>(&self, object: &ObjectRef<T>) -> Result<T> {
        let outcome = self.core().wait_outcome(object.as_untyped(), None).await?;
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerWoke);
        let outcome = outcome.expect("waiting without a deadline");
        let value = self
            .core()
            .shared_objects
            .decode_async(object.as_untyped().raw(), outcome)
            .await;
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerGot);
        value
    }

    /// Waits for an archived object and returns a validated view of it in
    /// place; see [`ObjectRef::get_archived`].
    pub fn get_archived<T: rkyv::Archive>(&self, object: &ObjectRef<T>) -> Result<ArchivedRef<T>>
    where
        T::Archived: Checkable,
    {
        let outcome = self.core().wait_outcome_blocking(object.as_untyped(), None)?;
        self.core()
            .shared_objects
            .archived_blocking(object.as_untyped().raw(), outcome.expect("waiting without a timeout"))
    }

    /// The values of all objects, in order; the first failure is returned.
    pub fn get_all<T: DeserializeOwned>(&self, objects: &[ObjectRef<T>]) -> Result<Vec<T>> {
        objects.iter().map(|object| self.get(object)).collect()
    }

    /// Waits until `num_returns` of the objects are ready or `timeout`
    /// passes. Returns the ready ones and the rest, each in input order.
    pub fn wait<T>(
        &self,
        objects: &[ObjectRef<T>],
        num_returns: usize,
        timeout: Option<Duration>,
    ) -> (Vec<ObjectRef<T>>, Vec<ObjectRef<T>>) {
        let num_returns = num_returns.min(objects.len());
        let core = self.core().clone();
        let ready = if objects.iter().all(|o| core.owner.owns(o.as_untyped())) {
            let ids: Vec<ObjectId> = objects.iter().map(|o| o.id()).collect();
            let deadline = timeout.map(|t| std::time::Instant::now() + t);
            core.owner.store.wait_many_blocking(&ids, num_returns, deadline)
        } else {
            let untyped: Vec<AnyObjectRef> = objects.iter().map(|o| o.as_untyped().clone()).collect();
            core.clone()
                .block_on(async move { wait_ready(&core, &untyped, num_returns, timeout).await })
        };
        let mut split = (Vec::new(), Vec::new());
        for (object, ready) in objects.iter().zip(ready) {
            match ready && split.0.len() < num_returns {
                true => split.0.push(object.clone()),
                false => split.1.push(object.clone()),
            }
        }
        split
    }

    /// Cancels the task that makes `object`: a queued task never runs; a
    /// running one is stopped only with `force`, which ends its worker.
    /// Getting the object then fails with a `Cancelled` task error.
    pub fn cancel<T>(&self, object: &ObjectRef<T>, force: bool) -> Result<()> {
        let core = self.core();
        if !core.owner.owns(object.as_untyped()) {
            return Err(Error::Cluster(raylet_proto::Error::FailedPrecondition(format!(
                "only the owner of object {} can cancel its task",
                object.id()
            ))));
        }
        core.submitter
            .send(SubmitterEvent::Cancel {
                object: object.id(),
                force,
            })
            .map_err(|_| shut_down())
    }

    /// The nodes of the cluster and their resources, as `raylet status` shows them.
    pub fn status(&self) -> Result<ClusterStatus> {
        let head = self.core().ctx().head_address.clone();
        let core = self.core().clone();
        core.clone()
            .block_on(async move { Ok(ClusterStatus::fetch(&head, &core.ctx().token, Duration::from_secs(5)).await?) })
    }

    /// The object stores of the alive nodes: usage, the objects in them and
    /// who holds references to them, as `raylet memory` shows them.
    pub fn memory(&self) -> Result<Vec<NodeMemory>> {
        let head = self.core().ctx().head_address.clone();
        let core = self.core().clone();
        core.clone()
            .block_on(async move { crate::observability::memory::collect_memory(&head, &core.ctx().token).await })
    }

    /// Ends this program's use of the cluster: its workers are killed, and an
    /// embedded cluster stops.
    pub fn shutdown(&self) -> Result<()> {
        let core = self.core().clone();
        let (done, acknowledged) = oneshot::channel();
        if core.submitter.send(SubmitterEvent::Shutdown(done)).is_ok() {
            let _ = core.block_on(async move { tokio::time::timeout(Duration::from_secs(5), acknowledged).await });
        }
        let flushing = core.clone();
        let last_events = async move { flushing.owner.task_events.flush(flushing.ctx()).await };
        let _ = core.block_on(async move { tokio::time::timeout(Duration::from_secs(2), last_events).await });
        core.shared_objects.close();
        drop(
            self.inner
                .owner_services
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        core.actors.close();
        let embedded = self.inner.embedded.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(embedded) = embedded {
            core.block_on(embedded.stop())?;
        }
        let mut current = CURRENT.write().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(&c.inner, &self.inner)) {
            *current = None;
        }
        drop(current);
        if let Some(runtime) = self.inner.runtime.lock().unwrap_or_else(|p| p.into_inner()).take() {
            runtime.shutdown_background();
        }
        Ok(())
    }
}

fn shut_down() -> Error {
    Error::Cluster(raylet_proto::Error::Unavailable(
        "the cluster handle was shut down".into(),
    ))
}

/// Which objects are ready, waiting until `num_returns` are or `timeout` passes.
async fn wait_ready(
    core: &Arc<CoreWorker>,
    objects: &[AnyObjectRef],
    num_returns: usize,
    timeout: Option<Duration>,
) -> Vec<bool> {
    let mut ready: Vec<bool> = objects
        .iter()
        .map(|o| core.owner.owns(o) && matches!(core.owner.store.try_get(o.id()), Ok(Some(_))))
        .collect();
    let mut count = ready.iter().filter(|r| **r).count();
    if count >= num_returns {
        return ready;
    }
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut waits = tokio::task::JoinSet::new();
    for (index, object) in objects.iter().enumerate().filter(|(i, _)| !ready[*i]) {
        let (core, object) = (core.clone(), object.clone());
        waits.spawn(async move { (index, matches!(core.wait_outcome(&object, deadline).await, Ok(Some(_)))) });
    }
    while count < num_returns {
        match waits.join_next().await {
            Some(Ok((index, true))) => {
                ready[index] = true;
                count += 1;
            }
            Some(_) => {}
            None => break,
        }
    }
    waits.abort_all();
    ready
}
