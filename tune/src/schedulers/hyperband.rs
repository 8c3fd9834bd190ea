//! Synchronous HyperBand: trials are dealt into brackets; in each bracket
//! every trial runs to the bracket's milestone and pauses there, and once
//! all of them have, the best 1/`reduction_factor` resume toward a
//! milestone `reduction_factor` times further and the rest stop. Brackets
//! differ in how many trials they start and how early they first cut.

use std::collections::HashMap;

use raylet_train::Metrics;

use super::{Decision, Objective, SchedulerContext, TrialScheduler, time_of};
use crate::{Mode, TuneError};

/// The HyperBand scheduler.
#[derive(Clone, Debug)]
pub struct HyperBand {
    objective: Objective,
    time_attr: String,
    max_t: f64,
    reduction_factor: f64,
    brackets: Vec<Bracket>,
    bracket_of: HashMap<String, usize>,
    /// The `s` of the bracket made next: from `s_max` down to 0, then again.
    next_s: u32,
}

/// One bracket: its trials, the milestone they run to, and the scores of
/// those that reached it.
#[derive(Clone, Debug)]
struct Bracket {
    capacity: usize,
    milestone: f64,
    live: Vec<String>,
    reached: HashMap<String, f64>,
}

impl HyperBand {
    /// Ray's defaults: `max_t` 81, `reduction_factor` 3, time in
    /// `training_iteration`.
    pub fn new() -> Self {
        HyperBand {
            objective: Objective::default(),
            time_attr: "training_iteration".into(),
            max_t: 81.0,
            reduction_factor: 3.0,
            brackets: Vec::new(),
            bracket_of: HashMap::new(),
            next_s: 0,
        }
    }

    pub fn objective(mut self, metric: &str, mode: Mode) -> Self {
        self.objective = Objective::new(Some(metric.into()), Some(mode));
        self
    }

    pub fn time_attr(mut self, attr: &str) -> Self {
        self.time_attr = attr.into();
        self
    }

    pub fn max_t(mut self, max_t: f64) -> Self {
        self.max_t = max_t;
        self
    }

    pub fn reduction_factor(mut self, factor: f64) -> Self {
        self.reduction_factor = factor;
        self
    }

    /// How many kinds of bracket there are: `s` runs from this minus 1 to 0.
    fn bracket_kinds(&self) -> u32 {
        ((self.max_t.ln() / self.reduction_factor.ln()) + 1e-9).floor() as u32 + 1
    }

    /// A new bracket of the next kind: `ceil(kinds / (s + 1) * eta^s)`
    /// trials that first run to `max_t * eta^-s`.
    fn open_bracket(&mut self) -> usize {
        let kinds = self.bracket_kinds();
        let s = self.next_s;
        self.next_s = match s {
            0 => kinds - 1,
            _ => s - 1,
        };
        let eta = self.reduction_factor;
        self.brackets.push(Bracket {
            capacity: (kinds as f64 / (s + 1) as f64 * eta.powi(s as i32)).ceil() as usize,
            milestone: (self.max_t * eta.powi(-(s as i32))).max(1.0),
            live: Vec::new(),
            reached: HashMap::new(),
        });
        self.brackets.len() - 1
    }

    /// Once every live trial of `bracket` reached its milestone: the best
    /// go on to the next one and the rest stop. Returns the decision for
    /// `reporting`, whom the caller tells itself.
    fn halve_if_all_reached(
        &mut self,
        bracket: usize,
        context: &mut SchedulerContext<'_>,
        reporting: Option<&str>,
    ) -> Option<Decision> {
        let eta = self.reduction_factor;
        let max_t = self.max_t;
        let bracket = &mut self.brackets[bracket];
        if bracket.live.is_empty() || bracket.live.iter().any(|trial| !bracket.reached.contains_key(trial)) {
            return None;
        }
        let mut ranked = bracket.live.clone();
        ranked.sort_by(|a, b| bracket.reached[b].total_cmp(&bracket.reached[a]));
        let keep = ((ranked.len() as f64 / eta).floor() as usize).max(1);
        let mut reporting_decision = None;
        for (place, trial) in ranked.iter().enumerate() {
            let decision = if place < keep {
                Decision::Continue
            } else {
                Decision::Stop
            };
            match (Some(trial.as_str()) == reporting, decision) {
                (true, decision) => reporting_decision = Some(decision),
                (false, Decision::Continue) => context.resume(trial),
                (false, _) => context.stop(trial),
            }
        }
        bracket.live.truncate(0);
        bracket.live.extend(ranked.into_iter().take(keep));
        bracket.reached.clear();
        bracket.milestone = (bracket.milestone * eta).min(max_t);
        reporting_decision
    }
}

impl Default for HyperBand {
    fn default() -> Self {
        Self::new()
    }
}

impl TrialScheduler for HyperBand {
    fn setup(&mut self, metric: Option<&str>, mode: Mode) -> Result<(), TuneError> {
        self.objective.setup("HyperBand", metric, mode)?;
        if !(self.max_t >= 1.0 && self.reduction_factor > 1.0) {
            return Err(TuneError::InvalidConfig(format!(
                "HyperBand needs max_t ({}) >= 1 and reduction_factor ({}) > 1",
                self.max_t, self.reduction_factor
            )));
        }
        self.next_s = self.bracket_kinds() - 1;
        Ok(())
    }

    fn on_trial_add(&mut self, _context: &mut SchedulerContext<'_>, trial: &str) {
        let bracket = match self.brackets.last() {
            Some(last) if last.live.len() < last.capacity && last.reached.is_empty() => self.brackets.len() - 1,
            _ => self.open_bracket(),
        };
        self.brackets[bracket].live.push(trial.to_string());
        self.bracket_of.insert(trial.to_string(), bracket);
    }

    fn on_trial_result(&mut self, context: &mut SchedulerContext<'_>, trial: &str, result: &Metrics) -> Decision {
        let Some(&index) = self.bracket_of.get(trial) else {
            return Decision::Continue;
        };
        let time = time_of(result, &self.time_attr);
        if time >= self.max_t {
            return Decision::Stop;
        }
        let bracket = &mut self.brackets[index];
        if time < bracket.milestone || !bracket.live.iter().any(|t| t == trial) {
            return Decision::Continue;
        }
        let score = self.objective.score(result).unwrap_or(f64::NEG_INFINITY);
        bracket.reached.insert(trial.to_string(), score);
        self.halve_if_all_reached(index, context, Some(trial))
            .unwrap_or(Decision::Pause)
    }

    fn on_trial_complete(&mut self, context: &mut SchedulerContext<'_>, trial: &str, _result: Option<&Metrics>) {
        let Some(&index) = self.bracket_of.get(trial) else {
            return;
        };
        let bracket = &mut self.brackets[index];
        bracket.live.retain(|t| t != trial);
        bracket.reached.remove(trial);
        self.halve_if_all_reached(index, context, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::Action;
    use crate::schedulers::scripted::{feed, result, running_trials};

    #[test]
    fn a_bracket_pauses_every_trial_at_its_milestone_then_keeps_the_best_third() {
        let mut hyperband = HyperBand::new().max_t(9.0).reduction_factor(3.0);
        hyperband.setup(Some("score"), Mode::Max).unwrap();
        let trials = running_trials(9);
        let mut context = SchedulerContext::new(&trials);
        for trial in &trials {
            hyperband.on_trial_add(&mut context, &trial.id);
        }
        // kinds = 3: the first bracket (s = 2) holds ceil(3/3 * 9) = 9 trials, milestone 1.
        assert_eq!(hyperband.brackets.len(), 1);
        assert_eq!(hyperband.brackets[0].milestone, 1.0);
        for i in 0..8 {
            let (decision, actions) = feed(&mut hyperband, &trials, &format!("t{i}"), &result(1, i as f64));
            assert_eq!(
                (decision, actions),
                (Decision::Pause, vec![]),
                "t{i} waits for the others"
            );
        }
        let (decision, actions) = feed(&mut hyperband, &trials, "t8", &result(1, 8.0));
        assert_eq!(decision, Decision::Continue, "t8 is the best");
        let resumed: Vec<&Action> = actions.iter().filter(|a| matches!(a, Action::Resume(_))).collect();
        assert_eq!(
            resumed,
            vec![&Action::Resume("t7".into()), &Action::Resume("t6".into())]
        );
        assert_eq!(actions.iter().filter(|a| matches!(a, Action::Stop(_))).count(), 6);
        assert_eq!(hyperband.brackets[0].milestone, 3.0);

        assert_eq!(
            feed(&mut hyperband, &trials, "t8", &result(2, 1.0)).0,
            Decision::Continue
        );
        assert_eq!(feed(&mut hyperband, &trials, "t8", &result(3, 1.0)).0, Decision::Pause);
        assert_eq!(feed(&mut hyperband, &trials, "t6", &result(3, 5.0)).0, Decision::Pause);
        let (decision, actions) = feed(&mut hyperband, &trials, "t7", &result(3, 0.5));
        assert_eq!(decision, Decision::Stop, "t7 is now the worst of three");
        assert_eq!(
            actions,
            vec![Action::Resume("t6".into()), Action::Stop("t8".into())],
            "only t6 goes on to max_t"
        );
        assert_eq!(feed(&mut hyperband, &trials, "t6", &result(9, 5.0)).0, Decision::Stop);
    }

    #[test]
    fn a_trial_that_ends_early_does_not_hold_up_its_bracket() {
        let mut hyperband = HyperBand::new().max_t(9.0).reduction_factor(3.0);
        hyperband.setup(Some("score"), Mode::Max).unwrap();
        let trials = running_trials(3);
        let mut context = SchedulerContext::new(&trials);
        for trial in &trials {
            hyperband.on_trial_add(&mut context, &trial.id);
        }
        assert_eq!(feed(&mut hyperband, &trials, "t0", &result(1, 1.0)).0, Decision::Pause);
        assert_eq!(feed(&mut hyperband, &trials, "t1", &result(1, 2.0)).0, Decision::Pause);
        let mut context = SchedulerContext::new(&trials);
        hyperband.on_trial_complete(&mut context, "t2", None);
        assert_eq!(
            context.into_actions(),
            vec![Action::Resume("t1".into()), Action::Stop("t0".into())]
        );
    }
}
