//! The experiment's driver loop: it fills free actor slots with trials
//! (the scheduler picks among waiting ones, the searcher makes new ones),
//! waits for any trial's next event, and acts on it: a result goes to the
//! searcher, the scheduler and the stopper, whose decision goes back to
//! the trial; an ended run finishes, pauses, restarts or fails the trial.
//! The experiment's callbacks are told of each step.

use std::time::{Duration, Instant};

use raylet::Cluster;
use raylet_train::{Checkpoint, Metrics, RunDirectory};

use super::actor_pool::ActorPool;
use super::dashboard::ExperimentBoard;
use super::experiment_state::{self, ExperimentState};
use super::progress::Progress;
use super::trial_state::{Donor, OnStop, Trial, TrialRecord};
use crate::callback::{Callbacks, ExperimentStart};
use crate::checkpoint_transfer::PackedCheckpoint;
use crate::runner::{StartFrom, TrialSetup};
use crate::schedulers::{Action, Decision, SchedulerContext, TrialScheduler};
use crate::search::{Searcher, Suggestion};
use crate::stopper::Stopper;
use crate::trial_event::TrialEvent;
use crate::{Mode, TrialStatus, TrialView, TuneError};

/// How long the loop waits for events before it redraws and checks stoppers.
const TICK: Duration = Duration::from_millis(200);
/// How often the state file is rewritten when only results changed.
const SAVE_EVERY: Duration = Duration::from_secs(2);

/// What the loop is given.
pub(crate) struct Plan {
    pub(crate) trainable: &'static str,
    /// The experiment's directory, mirrored to object storage for one kept there.
    pub(crate) directory: RunDirectory,
    pub(crate) name: String,
    pub(crate) metric: Option<String>,
    pub(crate) mode: Mode,
    pub(crate) num_samples: usize,
    pub(crate) max_failures: u32,
}

/// The driver of one experiment.
pub(crate) struct Controller {
    plan: Plan,
    searcher: Box<dyn Searcher>,
    scheduler: Box<dyn TrialScheduler>,
    stopper: Option<Box<dyn Stopper>>,
    cluster: Cluster,
    pool: ActorPool,
    progress: Progress,
    trials: Vec<Trial>,
    searcher_finished: bool,
    stopping: bool,
    last_saved: Instant,
    board: ExperimentBoard,
    callbacks: Callbacks,
}

impl Controller {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        plan: Plan,
        searcher: Box<dyn Searcher>,
        scheduler: Box<dyn TrialScheduler>,
        stopper: Option<Box<dyn Stopper>>,
        cluster: &Cluster,
        pool: ActorPool,
        progress: Progress,
        callbacks: Callbacks,
    ) -> Self {
        Controller {
            searcher,
            scheduler,
            stopper,
            cluster: cluster.clone(),
            pool,
            progress,
            trials: Vec::new(),
            searcher_finished: false,
            stopping: false,
            last_saved: Instant::now(),
            board: ExperimentBoard::new(&plan.name),
            plan,
            callbacks,
        }
    }

    /// Takes the trials of an interrupted run: finished ones stay as they
    /// are; the others wait to resume from their latest checkpoint. The
    /// searcher and scheduler are told about each, in order, and the
    /// scheduler sees every result each reported up to where it resumes.
    pub(crate) fn restore(&mut self, state: ExperimentState) -> Result<(), TuneError> {
        self.searcher_finished = state.searcher_finished;
        for record in state.trials {
            let trial = self.restored_trial(record)?;
            let reported = trial.history.clone();
            let outcome = match trial.status() {
                TrialStatus::Terminated => trial.view().last_result.clone(),
                _ => None,
            };
            self.searcher
                .restore_trial(trial.id(), &trial.view().config, outcome.as_ref());
            self.trials.push(trial);
            let index = self.trials.len() - 1;
            self.with_scheduler(|scheduler, context, id| scheduler.on_trial_add(context, id), index);
            for result in &reported {
                self.scheduler.restore_result(self.trials[index].id(), result);
            }
            if self.trials[index].status().is_finished() {
                let last = self.trials[index].view().last_result.clone();
                self.with_scheduler(|s, c, id| s.on_trial_complete(c, id, last.as_ref()), index);
            }
        }
        Ok(())
    }

    /// A trial of the interrupted run, in this node's copy of its
    /// directory: an unfinished one waits to resume from its latest
    /// checkpoint, and its results after that are dropped.
    fn restored_trial(&self, mut record: TrialRecord) -> Result<Trial, TuneError> {
        let directory = self.plan.directory.child(&record.view.id);
        directory.prepare()?;
        let mut history = experiment_state::read_history(&directory)?;
        // The state file keeps no storage options: the checkpoint is the
        // trial directory's, which a trial commits with its training
        // iteration as the index.
        record.latest_checkpoint = record
            .latest_checkpoint
            .map(|(_, iteration)| (directory.checkpoint(iteration), iteration));
        if !record.view.status.is_finished() {
            let resume_at = record.latest_checkpoint.as_ref().map_or(0, |(_, iteration)| *iteration);
            experiment_state::truncate_history(&directory, &mut history, resume_at)?;
            record.view.status = TrialStatus::Pending;
            record.view.iteration = resume_at;
            record.view.last_result = history.last().cloned();
        }
        Ok(Trial::new(record, directory, history))
    }

    /// Runs the experiment to its end, telling the callbacks when it
    /// starts and ends. The state file is written first, so that storage
    /// which refuses it fails the experiment before any trial runs.
    pub(crate) fn run(&mut self) -> Result<(), TuneError> {
        self.save()?;
        let start = ExperimentStart {
            name: &self.plan.name,
            directory: self.plan.directory.root(),
            metric: self.plan.metric.as_deref(),
            mode: self.plan.mode,
        };
        self.callbacks.each(|callback| callback.on_experiment_start(&start))?;
        let ran = self.run_trials();
        let trials: Vec<&TrialView> = self.trials.iter().map(Trial::view).collect();
        let ended = self
            .callbacks
            .each(|callback| callback.on_experiment_end(&trials, ran.as_ref().err()));
        ran.and(ended)
    }

    /// Runs trials until none is left to run.
    fn run_trials(&mut self) -> Result<(), TuneError> {
        loop {
            if !self.stopping && self.stopper.as_mut().is_some_and(|s| s.should_stop_experiment()) {
                self.stop_experiment();
            }
            self.fill_slots()?;
            if self.pool.busy() == 0 {
                if !self.stopping && self.resume_stranded_trials() {
                    continue;
                }
                break;
            }
            for slot in self.pool.ready(TICK) {
                self.handle(slot)?;
            }
            self.progress.update(&self.trials);
            self.show_on_dashboard(false);
            if self.last_saved.elapsed() >= SAVE_EVERY {
                self.save()?;
            }
        }
        self.save()?;
        self.show_on_dashboard(true);
        self.progress.finish(&self.trials);
        Ok(())
    }

    pub(crate) fn into_trials(self) -> Vec<Trial> {
        self.trials
    }

    /// Starts the trials the scheduler picks while slots are free.
    fn fill_slots(&mut self) -> Result<(), TuneError> {
        self.top_up_pending()?;
        while !self.stopping
            && let Some(slot) = self.pool.free_slot()
        {
            let chosen = {
                let context = SchedulerContext::new(self.trials.iter().map(Trial::view));
                self.scheduler.choose_trial_to_run(&context)
            };
            let Some(trial) = chosen.and_then(|id| self.index_of(&id)) else {
                return Ok(());
            };
            self.start(slot, trial)?;
            self.top_up_pending()?;
        }
        Ok(())
    }

    /// Makes new trials until as many wait as the searcher allows.
    fn top_up_pending(&mut self) -> Result<(), TuneError> {
        while !self.stopping && !self.searcher_finished {
            let pending = self
                .trials
                .iter()
                .filter(|t| t.status() == TrialStatus::Pending)
                .count();
            if pending >= self.searcher.max_pending() || self.new_trial()?.is_none() {
                break;
            }
        }
        Ok(())
    }

    /// A trial made from the searcher's next suggestion, if it has one now.
    fn new_trial(&mut self) -> Result<Option<usize>, TuneError> {
        let id = format!("trial_{:05}", self.trials.len());
        let config = match self.searcher.suggest(&id) {
            Suggestion::Config(config) => config,
            Suggestion::Wait => return Ok(None),
            Suggestion::Finished => {
                self.searcher_finished = true;
                self.save()?;
                return Ok(None);
            }
        };
        let directory = self.plan.directory.child(&id);
        directory.prepare()?;
        let record = TrialRecord {
            view: TrialView::pending(id, config),
            failures: 0,
            error: None,
            latest_checkpoint: None,
        };
        let trial = Trial::new(record, directory, Vec::new());
        trial.write_params()?;
        self.trials.push(trial);
        let index = self.trials.len() - 1;
        self.with_scheduler(|scheduler, context, id| scheduler.on_trial_add(context, id), index);
        Ok(Some(index))
    }

    fn start(&mut self, slot: usize, index: usize) -> Result<(), TuneError> {
        let start_from = self.start_point(index)?;
        let trial = &mut self.trials[index];
        let setup = TrialSetup {
            trainable: self.plan.trainable.to_string(),
            trial_id: trial.id().to_string(),
            config_json: serde_json::to_string(&trial.view().config).unwrap_or_default(),
            directory: trial.directory.clone(),
            start_from,
            time_before: trial.time_total(),
        };
        trial.set_status(TrialStatus::Running);
        trial.on_stop = OnStop::Terminate;
        trial.stop_requested = false;
        self.pool.start(slot, index, setup)?;
        let trial = self.trials[index].view();
        self.callbacks.each(|callback| callback.on_trial_start(trial))?;
        self.save()
    }

    /// Where a trial starts: a donor's checkpoint (PBT), its own latest, or scratch.
    fn start_point(&mut self, index: usize) -> Result<StartFrom, TuneError> {
        let trial = &mut self.trials[index];
        if let Some(donor) = trial.donor.take() {
            let packed = PackedCheckpoint::pack(&donor.checkpoint)?;
            return Ok(StartFrom::Donor {
                packed: self.cluster.put(&packed)?,
                iteration: donor.iteration,
                metrics: donor.metrics,
            });
        }
        Ok(match &trial.record.latest_checkpoint {
            Some((checkpoint, iteration)) => StartFrom::Checkpoint {
                checkpoint: checkpoint.clone(),
                iteration: *iteration,
            },
            None => StartFrom::Scratch,
        })
    }

    /// Acts on the events of the trial in `slot`.
    fn handle(&mut self, slot: usize) -> Result<(), TuneError> {
        let index = self.pool.trial_of(slot).expect("a ready slot runs a trial");
        let events = match self.pool.take_events(slot) {
            Ok(events) => events,
            Err(why) => {
                self.pool.discard(slot);
                return self.trial_failed(index, why.to_string());
            }
        };
        let mut decision = None;
        for event in events {
            match event {
                TrialEvent::Report { metrics, checkpoint } => {
                    decision = Some(self.on_result(index, metrics, checkpoint)?)
                }
                TrialEvent::Finished => {
                    self.pool.release(slot);
                    return self.finish(index, TrialStatus::Terminated);
                }
                TrialEvent::Stopped => {
                    self.pool.release(slot);
                    return self.run_stopped(index);
                }
                TrialEvent::Failed(why) => {
                    self.pool.release(slot);
                    return self.trial_failed(index, why);
                }
            }
        }
        self.pool.step(slot, decision);
        Ok(())
    }

    /// Records a result and decides what the trial does next.
    fn on_result(
        &mut self,
        index: usize,
        metrics: Metrics,
        checkpoint: Option<Checkpoint>,
    ) -> Result<Decision, TuneError> {
        let reported = checkpoint.clone();
        self.trials[index].record_result(&metrics, checkpoint)?;
        self.callbacks
            .result(self.trials[index].view(), &metrics, reported.as_ref())?;
        let id = self.trials[index].id().to_string();
        self.progress.result_line(&id, &metrics);
        self.searcher.on_trial_result(&id, &metrics);
        let (mut decision, actions) = {
            let mut context = SchedulerContext::new(self.trials.iter().map(Trial::view));
            let decision = self.scheduler.on_trial_result(&mut context, &id, &metrics);
            (decision, context.into_actions())
        };
        let stopped_by_rule = self
            .stopper
            .as_mut()
            .is_some_and(|s| s.should_stop_trial(&id, &metrics));
        if stopped_by_rule || self.trials[index].stop_requested || self.stopping {
            decision = Decision::Stop;
        }
        self.trials[index].on_stop = match decision {
            Decision::Pause => OnStop::Pause,
            _ => OnStop::Terminate,
        };
        self.apply(actions)?;
        Ok(decision)
    }

    /// Carries out what a scheduler asked for.
    fn apply(&mut self, actions: Vec<Action>) -> Result<(), TuneError> {
        for action in actions {
            match action {
                Action::Stop(id) => self.stop_trial(&id)?,
                Action::Resume(id) => self.resume_trial(&id),
                Action::Exploit { trial, donor, config } => self.exploit(&trial, &donor, config)?,
            }
        }
        Ok(())
    }

    fn stop_trial(&mut self, id: &str) -> Result<(), TuneError> {
        let Some(index) = self.index_of(id) else {
            return Ok(());
        };
        match self.trials[index].status() {
            TrialStatus::Running => {
                self.trials[index].stop_requested = true;
                self.trials[index].on_stop = OnStop::Terminate;
                Ok(())
            }
            TrialStatus::Pending | TrialStatus::Paused => self.finish(index, TrialStatus::Terminated),
            TrialStatus::Terminated | TrialStatus::Error => Ok(()),
        }
    }

    fn resume_trial(&mut self, id: &str) {
        let Some(index) = self.index_of(id) else {
            return;
        };
        let trial = &mut self.trials[index];
        match trial.status() {
            TrialStatus::Paused => trial.set_status(TrialStatus::Pending),
            TrialStatus::Running if trial.on_stop == OnStop::Pause => trial.on_stop = OnStop::Restart,
            _ => {}
        }
    }

    /// Re-seeds `id` with `donor`'s latest checkpoint and `config` (PBT).
    fn exploit(&mut self, id: &str, donor: &str, config: crate::TrialConfig) -> Result<(), TuneError> {
        let (Some(index), Some(donor_index)) = (self.index_of(id), self.index_of(donor)) else {
            return Ok(());
        };
        let Some((checkpoint, iteration)) = self.trials[donor_index].record.latest_checkpoint.clone() else {
            return Ok(());
        };
        let metrics = checkpoint.metadata().map(|m| m.metrics).unwrap_or_default();
        let trial = &mut self.trials[index];
        trial.donor = Some(Donor {
            checkpoint,
            iteration,
            metrics,
        });
        trial.record.view.config = config;
        trial.write_params()?;
        match trial.status() {
            TrialStatus::Running => trial.on_stop = OnStop::Restart,
            TrialStatus::Paused => trial.set_status(TrialStatus::Pending),
            _ => {}
        }
        tracing::info!("PBT: {id} restarts from {donor}'s checkpoint at iteration {iteration}");
        Ok(())
    }

    /// A run that stopped at the scheduler's word: the trial ends, pauses or
    /// waits to restart.
    fn run_stopped(&mut self, index: usize) -> Result<(), TuneError> {
        let on_stop = self.trials[index].on_stop;
        match on_stop {
            OnStop::Terminate => self.finish(index, TrialStatus::Terminated),
            OnStop::Pause => {
                self.trials[index].set_status(TrialStatus::Paused);
                self.save()
            }
            OnStop::Restart => {
                self.trials[index].set_status(TrialStatus::Pending);
                self.save()
            }
        }
    }

    /// A failed run: the trial restarts from its latest checkpoint while it
    /// has failures left, else it ends in error.
    fn trial_failed(&mut self, index: usize, why: String) -> Result<(), TuneError> {
        let trial = &mut self.trials[index];
        trial.record.failures += 1;
        tracing::warn!("{} failed ({} time(s)): {why}", trial.id(), trial.record.failures);
        if trial.record.failures <= self.plan.max_failures && !self.stopping {
            trial.set_status(TrialStatus::Pending);
            return self.save();
        }
        trial.record.error = Some(why);
        self.finish(index, TrialStatus::Error)
    }

    /// Ends a trial for good and tells the scheduler and searcher.
    fn finish(&mut self, index: usize, status: TrialStatus) -> Result<(), TuneError> {
        self.trials[index].set_status(status);
        let trial = &self.trials[index];
        let error = (status == TrialStatus::Error).then(|| trial.record.error.as_deref().unwrap_or_default());
        self.callbacks.trial_end(trial.view(), error)?;
        let last = self.trials[index].view().last_result.clone();
        let outcome = (status == TrialStatus::Terminated).then_some(last.clone()).flatten();
        let id = self.trials[index].id().to_string();
        self.searcher.on_trial_complete(&id, outcome.as_ref());
        let actions = {
            let mut context = SchedulerContext::new(self.trials.iter().map(Trial::view));
            self.scheduler.on_trial_complete(&mut context, &id, last.as_ref());
            context.into_actions()
        };
        self.trials[index].write_progress_csv()?;
        self.apply(actions)?;
        self.save()
    }

    /// The experiment's stopper fired: running trials stop at their next
    /// report and no trial starts; waiting ones stay for a restore.
    fn stop_experiment(&mut self) {
        self.stopping = true;
        for trial in &mut self.trials {
            if trial.status() == TrialStatus::Running {
                trial.stop_requested = true;
            }
        }
    }

    /// With nothing running and nothing to start, paused trials would wait
    /// forever: they are resumed.
    fn resume_stranded_trials(&mut self) -> bool {
        let mut resumed = false;
        for trial in &mut self.trials {
            if trial.status() == TrialStatus::Paused {
                trial.set_status(TrialStatus::Pending);
                resumed = true;
            }
        }
        resumed
    }

    fn with_scheduler(
        &mut self,
        call: impl FnOnce(&mut dyn TrialScheduler, &mut SchedulerContext<'_>, &str),
        index: usize,
    ) {
        let id = self.trials[index].id().to_string();
        let mut context = SchedulerContext::new(self.trials.iter().map(Trial::view));
        call(self.scheduler.as_mut(), &mut context, &id);
        let actions = context.into_actions();
        if let Err(e) = self.apply(actions) {
            tracing::warn!("applying the scheduler's actions: {e}");
        }
    }

    fn index_of(&self, id: &str) -> Option<usize> {
        self.trials.iter().position(|trial| trial.id() == id)
    }

    fn show_on_dashboard(&mut self, finished: bool) {
        let metric = self.plan.metric.as_deref().unwrap_or("");
        let goal = (metric, self.plan.mode);
        self.board
            .update(&self.cluster, &self.plan.name, goal, &self.trials, finished);
    }

    fn save(&mut self) -> Result<(), TuneError> {
        self.last_saved = Instant::now();
        let state = ExperimentState {
            name: self.plan.name.clone(),
            trainable: self.plan.trainable.to_string(),
            metric: self.plan.metric.clone(),
            mode: self.plan.mode,
            num_samples: self.plan.num_samples,
            searcher_finished: self.searcher_finished,
            trials: self.trials.iter().map(Trial::saved_record).collect(),
        };
        experiment_state::save(&self.plan.directory, &state)
    }
}
