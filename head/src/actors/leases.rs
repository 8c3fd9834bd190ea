//! The head's lease sessions with node managers, one per node and binary:
//! the workers that host actors are leased through them, resized once the
//! actor runs, and given back (which ends the worker) when it is killed.
//! A persistent head's leases outlive the session, so that the head adopts
//! them again: once restarted, or when a session broke and was opened anew.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::lease_session_request::Kind as LeaseRequest;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{
    AdoptLease, CancelLeaseRequest, GetWorkerExitRequest, LeaseRefusalKind, LeaseSessionRequest, RequestLease,
    ResizeLease, ReturnLease, WorkerBinary,
};
use raylet_proto::{NodeId, ResourceSet, Scheduling, SchedulingStrategy, WorkerId};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// How long the head waits for a node manager to answer a connection.
const NODE_PATIENCE: Duration = Duration::from_secs(2);

/// Why a lease call to a node manager failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The session ended before the request was answered.
    #[error("the node manager at {node} closed the lease session")]
    SessionClosed { node: String },
    /// The node manager could not be reached, or refused the session.
    #[error(transparent)]
    NodeCall(#[from] raylet_proto::Error),
}

type Result<T, E = LeaseError> = std::result::Result<T, E>;

/// A worker leased for an actor.
#[derive(Clone, Debug)]
pub struct Grant {
    pub node: String,
    pub worker_id: WorkerId,
    pub address: String,
    pub node_id: NodeId,
    /// The node's incarnation when it granted the lease.
    pub incarnation: u64,
    pub pid: u32,
}

/// A node manager's answer to a lease request.
#[derive(Debug)]
pub enum LeaseAnswer {
    Granted(Grant),
    Refused {
        reason: String,
        kind: LeaseRefusalKind,
    },
    /// The node is full; this other node has room.
    Spillback(String),
}

struct LeaseSession {
    requests: mpsc::UnboundedSender<LeaseSessionRequest>,
    pending: Mutex<HashMap<u64, Waiter>>,
    closed: AtomicBool,
}

/// Who waits for the answer to a lease request. A request that is not
/// pending was withdrawn (its actor was killed while it waited).
enum Waiter {
    Waiting(oneshot::Sender<LeaseAnswer>),
    /// A lease adopted again when the session reopened: its answer only
    /// confirms it.
    Readopted,
}

impl LeaseSession {
    fn pending(&self) -> MutexGuard<'_, HashMap<u64, Waiter>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, kind: LeaseRequest) {
        let _ = self.requests.send(LeaseSessionRequest { kind: Some(kind) });
    }

    /// Hands `answer` to the request waiting for it; a worker granted to a
    /// withdrawn request is given back at once, so that it holds nothing.
    fn answer(&self, request_id: u64, answer: LeaseAnswer) {
        let unclaimed = match self.pending().remove(&request_id) {
            Some(Waiter::Waiting(waiting)) => waiting.send(answer).err(),
            Some(Waiter::Readopted) => None,
            None => Some(answer),
        };
        if let Some(LeaseAnswer::Granted(grant)) = unclaimed {
            self.give_back(&grant);
        }
    }

    fn give_back(&self, grant: &Grant) {
        self.send(LeaseRequest::ReturnLease(ReturnLease {
            worker_id: grant.worker_id.as_bytes().to_vec(),
            worker_failed: true,
        }));
    }
}

/// The answer to a lease request, awaited. Dropped before it came (the
/// actor was killed while its lease waited), the request is withdrawn from
/// the node manager's queue, and a worker already granted is given back.
struct AwaitedAnswer<'a> {
    session: &'a LeaseSession,
    request_id: u64,
    answer: Option<oneshot::Receiver<LeaseAnswer>>,
}

impl AwaitedAnswer<'_> {
    /// The answer; `None` when the session closed first.
    async fn get(&mut self) -> Option<LeaseAnswer> {
        let answer = self.answer.as_mut()?.await.ok();
        self.answer = None;
        answer
    }
}

impl Drop for AwaitedAnswer<'_> {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        let withdrawn = self.session.pending().remove(&self.request_id).is_some();
        if withdrawn {
            self.session.send(LeaseRequest::Cancel(CancelLeaseRequest {
                request_id: self.request_id,
            }));
        } else if let Ok(LeaseAnswer::Granted(grant)) = answer.try_recv() {
            self.session.give_back(&grant);
        }
    }
}

/// The head's lease sessions, opened on first use.
pub struct HeadLeases {
    token: AuthToken,
    /// Leases outlive their session, for a restarted head to adopt: set for
    /// a head that persists its actors.
    outlive_sessions: bool,
    sessions: Arc<Mutex<Sessions>>,
    /// Held while a session is opened, so that one opens per key.
    opening: Mutex<HashMap<SessionKey, Arc<tokio::sync::Mutex<()>>>>,
    /// The workers that host live actors, by session: adopted again when
    /// their session is opened anew.
    hosting: Mutex<HashMap<SessionKey, HashSet<WorkerId>>>,
    next_request: AtomicU64,
}

/// A node manager's address and a binary's hash.
type SessionKey = (String, String);
type Sessions = HashMap<SessionKey, Arc<LeaseSession>>;

impl HeadLeases {
    pub fn new(token: AuthToken, outlive_sessions: bool) -> Self {
        HeadLeases {
            token,
            outlive_sessions,
            sessions: Arc::new(Mutex::new(HashMap::new())),
            opening: Mutex::new(HashMap::new()),
            hosting: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
        }
    }

    /// Asks the node manager at `node`, chosen by the head's placement, for
    /// a worker of `binary` holding `resources`; waits until it is granted,
    /// refused or spilled back: when the node can never fit it, or when
    /// another node has room first (one that joined while it waited). An
    /// actor in a placement group stays on its bundle's node.
    pub async fn request(
        &self,
        node: &str,
        binary: &WorkerBinary,
        resources: &ResourceSet,
        scheduling: &Scheduling,
    ) -> Result<LeaseAnswer> {
        self.ask(node, binary, |request_id| {
            LeaseRequest::Request(RequestLease {
                request_id,
                resources: Some(resources.to_proto()),
                allow_spillback: !matches!(scheduling.strategy, SchedulingStrategy::PlacementGroup { .. }),
                strategy: Some(scheduling.to_proto()),
                retriable: false,
                outlives_session: self.outlive_sessions,
            })
        })
        .await
    }

    /// Takes over the lease of `host`, granted to this head before it
    /// restarted; granted again when its worker still runs.
    pub async fn adopt(&self, host: &Grant, binary: &WorkerBinary) -> Result<LeaseAnswer> {
        let worker_id = host.worker_id.as_bytes().to_vec();
        self.ask(&host.node, binary, |request_id| {
            LeaseRequest::Adopt(AdoptLease {
                request_id,
                worker_id: worker_id.clone(),
            })
        })
        .await
    }

    /// Sends the request `make` builds under a new id and waits for its answer.
    async fn ask(
        &self,
        node: &str,
        binary: &WorkerBinary,
        make: impl FnOnce(u64) -> LeaseRequest,
    ) -> Result<LeaseAnswer> {
        let session = self.session(node, binary).await?;
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        session.pending().insert(request_id, Waiter::Waiting(answer));
        if session.closed.load(Ordering::Acquire) {
            session.pending().remove(&request_id);
        }
        session.send(make(request_id));
        let mut awaited = AwaitedAnswer {
            session: &session,
            request_id,
            answer: Some(answered),
        };
        let answer = awaited
            .get()
            .await
            .ok_or_else(|| LeaseError::SessionClosed { node: node.to_string() })?;
        Ok(match answer {
            LeaseAnswer::Granted(grant) => {
                self.hosts(node, binary, |hosts| hosts.insert(grant.worker_id));
                LeaseAnswer::Granted(Grant {
                    node: node.to_string(),
                    ..grant
                })
            }
            other => other,
        })
    }

    /// Runs `change` on the workers that host actors through the session
    /// of `node` and `binary`.
    fn hosts<T>(&self, node: &str, binary: &WorkerBinary, change: impl FnOnce(&mut HashSet<WorkerId>) -> T) -> T {
        let mut hosting = self.hosting.lock().unwrap_or_else(|p| p.into_inner());
        change(hosting.entry((node.to_string(), binary.hash.clone())).or_default())
    }

    /// The actor on `grant`'s worker is gone: its lease is not adopted again.
    pub fn forget(&self, grant: &Grant, binary: &WorkerBinary) {
        self.hosts(&grant.node, binary, |hosts| hosts.remove(&grant.worker_id));
    }

    /// Makes a granted lease hold `resources` from now on.
    pub async fn resize(&self, grant: &Grant, binary: &WorkerBinary, resources: &ResourceSet) -> Result<()> {
        let session = self.session(&grant.node, binary).await?;
        session.send(LeaseRequest::Resize(ResizeLease {
            worker_id: grant.worker_id.as_bytes().to_vec(),
            resources: Some(resources.to_proto()),
        }));
        Ok(())
    }

    /// Gives a lease back and has its node manager end the worker.
    pub async fn end_worker(&self, grant: &Grant, binary: &WorkerBinary) {
        self.forget(grant, binary);
        if let Ok(session) = self.session(&grant.node, binary).await {
            session.give_back(grant);
        }
    }

    /// How a leased worker exited, as its node manager saw it.
    pub async fn worker_exit(&self, grant: &Grant) -> String {
        let exit = async {
            let channel = raylet_proto::channel::connect(&grant.node, &self.token, NODE_PATIENCE).await?;
            let request = GetWorkerExitRequest {
                worker_id: grant.worker_id.as_bytes().to_vec(),
            };
            let reply = NodeManagerServiceClient::new(channel).get_worker_exit(request).await;
            Ok::<_, raylet_proto::Error>(reply?.into_inner())
        };
        match exit.await {
            Ok(exit) if exit.exited => format!("its worker (pid {}) {}", grant.pid, exit.description),
            Ok(_) => format!("its worker (pid {}) stopped answering", grant.pid),
            Err(error) => format!("its node {} is unreachable ({error})", grant.node),
        }
    }

    /// The open session of `node` and `binary`, opened when there is none.
    /// A session opened anew adopts the leases of the workers that host
    /// actors through it: the last one broke, and they outlived it.
    async fn session(&self, node: &str, binary: &WorkerBinary) -> Result<Arc<LeaseSession>> {
        let key = (node.to_string(), binary.hash.clone());
        if let Some(session) = self.sessions().get(&key) {
            return Ok(session.clone());
        }
        let opening = {
            let mut opening = self.opening.lock().unwrap_or_else(|p| p.into_inner());
            opening.entry(key.clone()).or_default().clone()
        };
        let _opening = opening.lock().await;
        if let Some(session) = self.sessions().get(&key) {
            return Ok(session.clone());
        }
        let opened = self.open(key.clone(), binary).await?;
        let hosted: Vec<WorkerId> = self.hosts(node, binary, |hosts| hosts.iter().copied().collect());
        for worker_id in hosted {
            let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
            opened.pending().insert(request_id, Waiter::Readopted);
            opened.send(LeaseRequest::Adopt(AdoptLease {
                request_id,
                worker_id: worker_id.as_bytes().to_vec(),
            }));
        }
        self.sessions().insert(key, opened.clone());
        Ok(opened)
    }

    /// Opens a session; when the node manager ends it, it is forgotten and
    /// its waiting requests fail.
    async fn open(&self, key: (String, String), binary: &WorkerBinary) -> Result<Arc<LeaseSession>> {
        let channel = raylet_proto::channel::connect(&key.0, &self.token, NODE_PATIENCE).await?;
        let (requests, outbound) = mpsc::unbounded_channel();
        let _ = requests.send(LeaseSessionRequest {
            kind: Some(LeaseRequest::Open(binary.clone())),
        });
        let reply = NodeManagerServiceClient::new(channel)
            .lease_session(UnboundedReceiverStream::new(outbound))
            .await;
        let mut events = reply.map_err(raylet_proto::Error::from)?.into_inner();
        let session = Arc::new(LeaseSession {
            requests,
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        });
        let answering = session.clone();
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            while let Ok(Some(event)) = events.message().await {
                if let Some((request_id, answer)) = event.kind.and_then(answer_of) {
                    answering.answer(request_id, answer);
                }
            }
            answering.closed.store(true, Ordering::Release);
            answering.pending().clear();
            let mut sessions = sessions.lock().unwrap_or_else(|p| p.into_inner());
            if sessions.get(&key).is_some_and(|open| Arc::ptr_eq(open, &answering)) {
                sessions.remove(&key);
            }
        });
        Ok(session)
    }

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn answer_of(event: LeaseEvent) -> Option<(u64, LeaseAnswer)> {
    match event {
        LeaseEvent::Granted(granted) => {
            let grant = Grant {
                node: String::new(),
                worker_id: WorkerId::from_wire(&granted.worker_id).ok()?,
                address: granted.worker_address,
                node_id: NodeId::from_wire(&granted.node_id).ok()?,
                incarnation: granted.incarnation,
                pid: granted.pid,
            };
            Some((granted.request_id, LeaseAnswer::Granted(grant)))
        }
        LeaseEvent::Refused(refused) => Some((
            refused.request_id,
            LeaseAnswer::Refused {
                kind: refused.kind(),
                reason: refused.reason,
            },
        )),
        LeaseEvent::Spillback(spillback) => {
            Some((spillback.request_id, LeaseAnswer::Spillback(spillback.node_address)))
        }
    }
}
