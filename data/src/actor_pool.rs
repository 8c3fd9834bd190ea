//! Actor pools for a dataset with a model stage: each actor loads the model
//! once and then processes whole blocks (read, stages, model) one call at a
//! time. The pool starts at its minimum size, grows by one actor whenever a
//! block waits and every actor is busy (up to its maximum and what the
//! cluster holds), shrinks back after actors idle, and replaces an actor
//! whose worker died.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use raylet::{Cluster, ObjectRef};
use serde_bytes::ByteBuf;

use crate::DataError;
use crate::block_output::BlockOutput;
use crate::model::LoadError;
use crate::model_registry::{self, LoadedModel};
use crate::task::{self, BlockError, BlockJob};

/// Calls queued on one actor at once, so it never waits between blocks.
const CALLS_PER_ACTOR: usize = 2;
/// How long an actor beyond the minimum may idle before it is stopped.
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many actors run a model stage, and what each holds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ActorPoolStrategy {
    pub min: usize,
    pub max: usize,
    pub num_cpus: f64,
    pub num_gpus: f64,
}

impl ActorPoolStrategy {
    /// Always `actors` actors.
    pub fn fixed(actors: usize) -> Self {
        Self::autoscaling(actors, actors)
    }

    /// Between `min` and `max` actors, growing with the blocks waiting.
    pub fn autoscaling(min: usize, max: usize) -> Self {
        let min = min.max(1);
        ActorPoolStrategy {
            min,
            max: max.max(min),
            num_cpus: 1.0,
            num_gpus: 0.0,
        }
    }

    /// CPUs each actor holds (default 1).
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.num_cpus = cpus;
        self
    }

    /// GPUs each actor holds (default 0; fractions share a GPU).
    pub fn num_gpus(mut self, gpus: f64) -> Self {
        self.num_gpus = gpus;
        self
    }
}

/// The actor that runs a dataset's blocks with its loaded model.
#[raylet::actor]
pub(crate) struct BlockWorker {
    model: Mutex<Box<dyn LoadedModel>>,
}

#[raylet::actor]
impl BlockWorker {
    pub fn new(model: String, config: ByteBuf) -> Result<Self, LoadError> {
        Ok(BlockWorker {
            model: Mutex::new(model_registry::load(&model, &config)?),
        })
    }

    pub fn process(&mut self, job: BlockJob) -> Result<BlockOutput, BlockError> {
        let model = self.model.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        task::run_stages(&job, Some(model.as_mut()))
    }
}

/// The model a pool's actors load.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ModelSpec {
    pub name: String,
    pub config: Vec<u8>,
    pub strategy: ActorPoolStrategy,
}

struct PoolActor {
    id: u64,
    handle: BlockWorkerHandle,
    calls: usize,
    idle_since: Instant,
}

/// A running pool.
pub(crate) struct ActorPool {
    cluster: Cluster,
    model: ModelSpec,
    /// The most actors the cluster's nodes hold.
    cap: usize,
    actors: Vec<PoolActor>,
    next_id: u64,
    largest: usize,
}

impl ActorPool {
    /// Starts the pool's minimum of actors; fails when the cluster cannot
    /// hold that many.
    pub fn start(cluster: Cluster, model: ModelSpec) -> Result<Self, DataError> {
        model_registry::find(&model.name)?;
        let cap = capacity(&cluster, &model.strategy)?;
        if cap < model.strategy.min {
            return Err(DataError::InvalidInput(format!(
                "the cluster holds {cap} actors of {} CPUs and {} GPUs, fewer than the pool's minimum of {}",
                model.strategy.num_cpus, model.strategy.num_gpus, model.strategy.min
            )));
        }
        let mut pool = ActorPool {
            cluster,
            model,
            cap,
            actors: Vec::new(),
            next_id: 0,
            largest: 0,
        };
        for _ in 0..pool.model.strategy.min {
            pool.spawn()?;
        }
        Ok(pool)
    }

    fn spawn(&mut self) -> Result<u64, DataError> {
        let strategy = self.model.strategy;
        let handle = BlockWorker::remote(
            &self.cluster,
            self.model.name.clone(),
            ByteBuf::from(self.model.config.clone()),
        )
        .num_cpus(strategy.num_cpus)
        .num_gpus(strategy.num_gpus)
        .max_restarts(0)
        .spawn()?;
        self.next_id += 1;
        self.actors.push(PoolActor {
            id: self.next_id,
            handle,
            calls: 0,
            idle_since: Instant::now(),
        });
        self.largest = self.largest.max(self.actors.len());
        Ok(self.next_id)
    }

    /// An actor to give a waiting block to: an idle one, else a new one
    /// while the pool may grow, else one with room in its queue.
    pub fn actor_with_room(&mut self) -> Result<Option<u64>, DataError> {
        if let Some(idle) = self.actors.iter().find(|a| a.calls == 0) {
            return Ok(Some(idle.id));
        }
        if self.actors.len() < self.model.strategy.max.min(self.cap) {
            return self.spawn().map(Some);
        }
        Ok(self
            .actors
            .iter()
            .filter(|a| a.calls < CALLS_PER_ACTOR)
            .min_by_key(|a| a.calls)
            .map(|a| a.id))
    }

    /// Sends a block to actor `id`.
    pub fn submit(&mut self, id: u64, job: BlockJob) -> ObjectRef<BlockOutput> {
        let actor = self
            .actors
            .iter_mut()
            .find(|a| a.id == id)
            .expect("an actor of the pool");
        actor.calls += 1;
        actor.handle.process(job)
    }

    /// A call of actor `id` returned (a late one of an actor already
    /// counted lost changes nothing).
    pub fn returned(&mut self, id: u64) {
        if let Some(actor) = self.actors.iter_mut().find(|a| a.id == id) {
            actor.calls -= 1;
            if actor.calls == 0 {
                actor.idle_since = Instant::now();
            }
        }
    }

    /// Actor `id` died: it is replaced when the pool would fall below its minimum.
    pub fn lost(&mut self, id: u64) -> Result<(), DataError> {
        if let Some(position) = self.actors.iter().position(|a| a.id == id) {
            let actor = self.actors.remove(position);
            let _ = self.cluster.kill(&actor.handle, true);
        }
        if self.actors.len() < self.model.strategy.min {
            self.spawn()?;
        }
        Ok(())
    }

    /// Stops actors beyond the minimum that idled past the timeout.
    pub fn shrink_idle(&mut self) {
        while self.actors.len() > self.model.strategy.min {
            let Some(position) = self
                .actors
                .iter()
                .position(|a| a.calls == 0 && a.idle_since.elapsed() >= IDLE_TIMEOUT)
            else {
                break;
            };
            let actor = self.actors.remove(position);
            let _ = self.cluster.kill(&actor.handle, true);
        }
    }

    pub fn size(&self) -> usize {
        self.actors.len()
    }

    /// The most actors the pool had at once.
    pub fn largest(&self) -> usize {
        self.largest
    }
}

impl Drop for ActorPool {
    fn drop(&mut self) {
        for actor in self.actors.drain(..) {
            let _ = self.cluster.kill(&actor.handle, true);
        }
    }
}

/// How many of the strategy's actors the alive nodes hold, node by node.
fn capacity(cluster: &Cluster, strategy: &ActorPoolStrategy) -> Result<usize, DataError> {
    let request = [
        ("CPU".to_string(), strategy.num_cpus),
        ("GPU".to_string(), strategy.num_gpus),
    ];
    Ok(cluster.status()?.fitting(&request))
}
