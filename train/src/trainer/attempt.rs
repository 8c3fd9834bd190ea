//! One try of a run: the workers are placed all at once in a placement
//! group (all or nothing), each starts its rank of the train loop, and the
//! driver polls them for reports until every rank finished or one failed.
//! However the try ends, its workers are killed and its group removed.

use crate::checkpoint::RunDirectory;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use raylet::{Bundle, Cluster, ObjectRef, PlacementGroup};

use super::progress::Progress;
use super::result::Report;
use super::room::free_workers;
use super::run_state::RunState;
use crate::worker::{TrainWorker, TrainWorkerHandle, WorkerSetup};
use crate::worker_event::WorkerEvent;
use crate::{ScalingConfig, TrainError, WorkerResources};

/// How long one poll of a worker waits for its first event.
const POLL_WAIT: Duration = Duration::from_millis(500);
/// How long the workers' bundles may take before the driver says it waits.
const PLACEMENT_PATIENCE: Duration = Duration::from_secs(5);
/// How often an elastic group looks for room again while it waits.
const ROOM_POLL: Duration = Duration::from_millis(200);
/// How long a try that follows a growing one waits for the room it grows
/// into before it starts with what there is.
const GROW_PATIENCE: Duration = Duration::from_secs(10);

/// How a try ended other than by finishing.
pub(super) enum AttemptError {
    /// The run cannot go on (the cluster cannot hold the workers, the run's
    /// directory cannot be written): no restart would help.
    Fatal(TrainError),
    /// A worker died or a train loop failed: the run may restart.
    Failed(String),
    /// The caller's report hook asked the run to stop.
    Stopped,
    /// An elastic group has room for `workers`: the run goes on from the
    /// checkpoint just made with a larger group.
    Grow { workers: usize, why: String },
}

impl From<TrainError> for AttemptError {
    fn from(error: TrainError) -> Self {
        AttemptError::Fatal(error)
    }
}

/// Each rank's shard of each dataset, by rank.
pub(super) type RankShards = Vec<BTreeMap<String, ObjectRef<Vec<u8>>>>;

/// What every try of a run shares.
pub(super) struct Plan {
    pub(super) train_loop: &'static str,
    pub(super) config: Vec<u8>,
    pub(super) scaling: ScalingConfig,
    pub(super) group_prefix: String,
    pub(super) collective_timeout: Duration,
    pub(super) run_directory: RunDirectory,
    /// For each size the group may have, each rank's shard of each dataset.
    pub(super) shards: BTreeMap<usize, RankShards>,
}

/// Runs try number `attempt` of the run to its end; an elastic group waits
/// a while for room for `wanted` workers when the last try ended to grow.
pub(super) fn run(
    cluster: &Cluster,
    plan: &Plan,
    attempt: u32,
    wanted: Option<usize>,
    state: &mut RunState,
    progress: &Progress,
    on_report: &mut dyn FnMut(&Report) -> ControlFlow<()>,
) -> Result<(), AttemptError> {
    let world = workers_for_try(cluster, &plan.scaling, wanted, progress)?;
    let workers = Workers::place(cluster, &plan.scaling, world, progress)?;
    let starts: Vec<ObjectRef<u32>> = workers
        .actors
        .iter()
        .enumerate()
        .map(|(rank, worker)| worker.start(setup(plan, attempt, rank, world, state)))
        .collect();
    for (rank, start) in starts.iter().enumerate() {
        start
            .get()
            .map_err(|e| AttemptError::Failed(format!("rank {rank} could not start: {e}")))?;
    }
    let mut running: Vec<usize> = (0..workers.actors.len()).collect();
    while !running.is_empty() {
        let wait_ms = POLL_WAIT.as_millis() as u64;
        let polls: Vec<(usize, ObjectRef<Vec<WorkerEvent>>)> = running
            .iter()
            .map(|&rank| (rank, workers.actors[rank].poll(wait_ms)))
            .collect();
        let mut failures = Vec::new();
        for (rank, poll) in polls {
            let events = match poll.get() {
                Ok(events) => events,
                Err(e) => {
                    failures.push(format!("rank {rank}'s worker: {e}"));
                    continue;
                }
            };
            for event in events {
                match event {
                    WorkerEvent::Report {
                        index,
                        metrics,
                        checkpoint,
                    } => {
                        progress.report(index, &metrics, checkpoint.as_ref());
                        let checkpointed = checkpoint.is_some();
                        let report = Report {
                            index,
                            attempt,
                            world_size: world,
                            metrics,
                            checkpoint,
                        };
                        let flow = on_report(&report);
                        state.record(report)?;
                        if flow.is_break() {
                            return Err(AttemptError::Stopped);
                        }
                        if checkpointed && let Some(workers) = room_to_grow(cluster, &plan.scaling, world)? {
                            let why = format!(
                                "the cluster has room for {workers} workers of at most {}",
                                plan.scaling.num_workers
                            );
                            return Err(AttemptError::Grow { workers, why });
                        }
                    }
                    WorkerEvent::Finished => running.retain(|&r| r != rank),
                    WorkerEvent::Failed(why) => failures.push(format!("rank {rank}: {why}")),
                }
            }
        }
        if !failures.is_empty() {
            return Err(AttemptError::Failed(failures.join("; ")));
        }
    }
    Ok(())
}

/// How many workers a try has: `num_workers`, or for an elastic group as
/// many as the cluster has room for, up to that, once it has room for the
/// minimum. The last try's workers free their resources a moment after it
/// ends, so room for `wanted` workers is waited for up to
/// [`GROW_PATIENCE`].
fn workers_for_try(
    cluster: &Cluster,
    scaling: &ScalingConfig,
    wanted: Option<usize>,
    progress: &Progress,
) -> Result<usize, TrainError> {
    if scaling.elastic.is_none() {
        return Ok(scaling.num_workers);
    }
    let min = scaling.min_workers();
    let started = Instant::now();
    let mut waiting = false;
    loop {
        let room =
            free_workers(cluster, &bundle_of(&worker_resources(scaling)), scaling.placement)?.min(scaling.num_workers);
        let patient = wanted.is_some_and(|wanted| room < wanted && started.elapsed() < GROW_PATIENCE);
        if room >= min && !patient {
            return Ok(room);
        }
        if room < min && !waiting {
            progress.line(&format!(
                "waiting for room for at least {min} workers of {} (room for {room} now)",
                describe(&worker_resources(scaling))
            ));
            waiting = true;
        }
        std::thread::sleep(ROOM_POLL);
    }
}

/// How many workers an elastic group of `world` has room to grow to now,
/// if more than `world`.
fn room_to_grow(cluster: &Cluster, scaling: &ScalingConfig, world: usize) -> Result<Option<usize>, TrainError> {
    if scaling.elastic.is_none() || world >= scaling.num_workers {
        return Ok(None);
    }
    let room = free_workers(cluster, &bundle_of(&worker_resources(scaling)), scaling.placement)?;
    Ok((room > 0).then(|| (world + room).min(scaling.num_workers)))
}

/// What rank `rank` of try `attempt`, of `world` ranks, starts with.
fn setup(plan: &Plan, attempt: u32, rank: usize, world: usize, state: &RunState) -> WorkerSetup {
    WorkerSetup {
        train_loop: plan.train_loop.to_string(),
        config: plan.config.clone(),
        rank,
        world_size: world,
        max_workers: plan.scaling.num_workers,
        batch_scaling: plan.scaling.batch_scaling(),
        attempt,
        use_gpu: plan.scaling.use_gpu,
        group_name: format!("{}/attempt-{attempt}", plan.group_prefix),
        collective_timeout: plan.collective_timeout,
        run_directory: plan.run_directory.clone(),
        resume_from: state.latest(),
        next_report: state.next_report(),
        shards: plan.shards[&world][rank].clone(),
    }
}

/// The workers of one try and their placement group; dropping them kills
/// the workers and removes the group.
struct Workers {
    cluster: Cluster,
    group: PlacementGroup,
    actors: Vec<TrainWorkerHandle>,
}

impl Workers {
    /// Reserves a bundle for each of `count` workers, all at once, then
    /// starts a worker actor in each.
    fn place(
        cluster: &Cluster,
        scaling: &ScalingConfig,
        count: usize,
        progress: &Progress,
    ) -> Result<Self, TrainError> {
        let resources = worker_resources(scaling);
        let bundles = vec![bundle_of(&resources); count];
        let group = cluster.placement_group(bundles, scaling.placement)?;
        let mut workers = Workers {
            cluster: cluster.clone(),
            group,
            actors: Vec::new(),
        };
        match workers.group.ready_timeout(PLACEMENT_PATIENCE) {
            Err(raylet::Error::PlacementGroupTimeout { .. }) => {
                progress.line(&format!(
                    "waiting for the cluster to free {count} bundles of {}",
                    describe(&resources)
                ));
                workers.group.ready()?;
            }
            placed => placed?,
        }
        for bundle in 0..count {
            let builder = TrainWorker::remote(cluster)
                .placement_group(&workers.group, Some(bundle as u32))
                .max_restarts(0);
            workers.actors.push(resources.request(builder).spawn()?);
        }
        Ok(workers)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for actor in &self.actors {
            if let Err(e) = self.cluster.kill(actor, true) {
                tracing::warn!("killing a train worker: {e}");
            }
        }
        if let Err(e) = self.group.remove() {
            tracing::warn!("removing a run's placement group: {e}");
        }
    }
}

/// A worker's resources, with the GPU that `use_gpu` asks for.
fn worker_resources(scaling: &ScalingConfig) -> WorkerResources {
    let mut resources = scaling.resources_per_worker.clone();
    if scaling.use_gpu && resources.num_gpus == 0.0 {
        resources.num_gpus = 1.0;
    }
    resources
}

fn bundle_of(resources: &WorkerResources) -> Bundle {
    let mut bundle = Bundle::new().num_cpus(resources.num_cpus);
    if resources.num_gpus > 0.0 {
        bundle = bundle.num_gpus(resources.num_gpus);
    }
    if resources.memory > 0.0 {
        bundle = bundle.memory(resources.memory);
    }
    for (name, amount) in &resources.custom {
        bundle = bundle.resource(name, *amount);
    }
    bundle
}

/// `{CPU: 1, GPU: 1}`: the nonzero resources of a worker.
fn describe(resources: &WorkerResources) -> String {
    let standard = [
        ("CPU", resources.num_cpus),
        ("GPU", resources.num_gpus),
        ("memory", resources.memory),
    ];
    let custom = resources.custom.iter().map(|(name, amount)| (name.as_str(), *amount));
    let amounts: Vec<String> = standard
        .into_iter()
        .chain(custom)
        .filter(|(_, amount)| *amount > 0.0)
        .map(|(name, amount)| format!("{name}: {amount}"))
        .collect();
    format!("{{{}}}", amounts.join(", "))
}
