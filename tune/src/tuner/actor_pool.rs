//! The trial actors: one slot per trial that may run at once. A slot's
//! actor is started on first use and, with `reuse_actors`, kept for the
//! next trial. Each busy slot has one `step` call in flight.

use std::time::Duration;

use raylet::{Cluster, ObjectRef};

use super::TrialResources;
use crate::TuneError;
use crate::runner::{TrialRunner, TrialRunnerHandle, TrialSetup};
use crate::schedulers::Decision;
use crate::trial_event::TrialEvent;

/// Why a trial's actor answered a step with no events.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActorFailure {
    #[error("its actor could not start it: {0}")]
    Start(#[source] raylet::Error),
    #[error("its actor failed: {0}")]
    Step(#[source] raylet::Error),
}

/// How long a `step` call waits on the actor for the trial's next event.
const STEP_WAIT: Duration = Duration::from_millis(1000);

/// One slot: its actor, the trial it runs, and the calls in flight.
#[derive(Default)]
struct Slot {
    actor: Option<TrialRunnerHandle>,
    trial: Option<usize>,
    start: Option<ObjectRef<u32>>,
    step: Option<ObjectRef<Vec<TrialEvent>>>,
}

/// The trial actors of an experiment.
pub(crate) struct ActorPool {
    cluster: Cluster,
    resources: TrialResources,
    reuse_actors: bool,
    slots: Vec<Slot>,
}

impl ActorPool {
    pub(crate) fn new(cluster: &Cluster, resources: TrialResources, reuse_actors: bool, slots: usize) -> Self {
        ActorPool {
            cluster: cluster.clone(),
            resources,
            reuse_actors,
            slots: (0..slots).map(|_| Slot::default()).collect(),
        }
    }

    pub(crate) fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|slot| slot.trial.is_none())
    }

    pub(crate) fn busy(&self) -> usize {
        self.slots.iter().filter(|slot| slot.trial.is_some()).count()
    }

    /// The trial a slot runs.
    pub(crate) fn trial_of(&self, slot: usize) -> Option<usize> {
        self.slots[slot].trial
    }

    /// Starts `trial` in `slot`, with an actor made for it if the slot has none.
    pub(crate) fn start(&mut self, slot: usize, trial: usize, setup: TrialSetup) -> Result<(), TuneError> {
        if self.slots[slot].actor.is_none() {
            self.slots[slot].actor = Some(self.spawn()?);
        }
        let entry = &mut self.slots[slot];
        let actor = entry.actor.as_ref().expect("made above");
        entry.start = Some(actor.start(setup));
        entry.step = Some(actor.step(None, STEP_WAIT.as_millis() as u64));
        entry.trial = Some(trial);
        Ok(())
    }

    fn spawn(&self) -> Result<TrialRunnerHandle, TuneError> {
        let builder = TrialRunner::remote(&self.cluster).max_restarts(0);
        Ok(self.resources.request(builder).spawn()?)
    }

    /// Sends the decision on the slot's last report and asks for its next events.
    pub(crate) fn step(&mut self, slot: usize, decision: Option<Decision>) {
        let entry = &mut self.slots[slot];
        if let Some(actor) = &entry.actor {
            entry.step = Some(actor.step(decision, STEP_WAIT.as_millis() as u64));
        }
    }

    /// The busy slots whose `step` answered, waiting up to `timeout` for one.
    pub(crate) fn ready(&self, timeout: Duration) -> Vec<usize> {
        let in_flight: Vec<(usize, ObjectRef<Vec<TrialEvent>>)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| Some((index, slot.step.clone()?)))
            .collect();
        if in_flight.is_empty() {
            return Vec::new();
        }
        let refs: Vec<ObjectRef<Vec<TrialEvent>>> = in_flight.iter().map(|(_, step)| step.clone()).collect();
        let (first, _) = self.cluster.wait(&refs, 1, Some(timeout));
        if first.is_empty() {
            return Vec::new();
        }
        let (ready, _) = self.cluster.wait(&refs, refs.len(), Some(Duration::ZERO));
        in_flight
            .into_iter()
            .filter(|(_, step)| ready.iter().any(|r| r.id() == step.id()))
            .map(|(index, _)| index)
            .collect()
    }

    /// The answered `step` of a slot: its events, or why the actor failed
    /// (with the trial's start error when that is the cause).
    pub(crate) fn take_events(&mut self, slot: usize) -> Result<Vec<TrialEvent>, ActorFailure> {
        let entry = &mut self.slots[slot];
        let step = entry.step.take().expect("only answered slots are read");
        match step.get() {
            Ok(events) => Ok(events),
            Err(step_error) => match entry.start.as_ref().map(|start| start.get()) {
                Some(Err(start_error)) => Err(ActorFailure::Start(start_error)),
                _ => Err(ActorFailure::Step(step_error)),
            },
        }
    }

    /// The slot's trial ended; its actor stays for the next one if reused.
    pub(crate) fn release(&mut self, slot: usize) {
        let entry = &mut self.slots[slot];
        entry.trial = None;
        entry.start = None;
        entry.step = None;
        if !self.reuse_actors {
            self.kill(slot);
        }
    }

    /// The slot's actor failed: it is killed and a new one made on next use.
    pub(crate) fn discard(&mut self, slot: usize) {
        self.release(slot);
        self.kill(slot);
    }

    fn kill(&mut self, slot: usize) {
        if let Some(actor) = self.slots[slot].actor.take()
            && let Err(e) = self.cluster.kill(&actor, true)
        {
            tracing::debug!("killing a trial actor: {e}");
        }
    }
}

impl Drop for ActorPool {
    fn drop(&mut self) {
        for slot in 0..self.slots.len() {
            self.kill(slot);
        }
    }
}
