//! What a router knows of how loaded each replica is, and which of them it
//! sends a request to.
//!
//! **Estimate.** Every estimate is a fraction of the replica's capacity.
//! For a replica that reports its fullness
//! ([`Deployment::fullness`](crate::Deployment::fullness)), it is the last
//! fullness reported plus [`UNREPORTED_CALL_FULLNESS`] for each call this
//! router sent after the call that carried the report, so that a burst
//! spreads over replicas before their next reports come. For one that does
//! not, or whose report is older than [`REPORT_TTL`], it is the calls this
//! router has in flight there plus the others the replica last reported
//! (its reply's `ongoing` minus ours, also forgotten after
//! [`REPORT_TTL`]), over `max_ongoing_requests`.
//!
//! **Room.** A replica has room while its ongoing requests (ours plus the
//! others reported) are below `max_ongoing_requests`, always; while the
//! fullness it reported is below 1; and unless it rejected a request in
//! the last [`REJECTED_PAUSE`].
//!
//! **Choice.** Of two sampled replicas with room, the one with the lower
//! estimate; if neither has room, the least loaded with room of all; if
//! none has, none.

use std::time::{Duration, Instant};

/// How long a replica's report counts.
pub(crate) const REPORT_TTL: Duration = Duration::from_secs(1);
/// How long a replica that rejected a request counts as full.
pub(crate) const REJECTED_PAUSE: Duration = Duration::from_millis(100);
/// What each call sent to a replica since its last fullness report adds
/// to that fullness: a fiftieth of its capacity.
pub(crate) const UNREPORTED_CALL_FULLNESS: f64 = 0.02;

/// What one router knows of how loaded one replica is.
#[derive(Debug, Default)]
pub(crate) struct LoadEstimate {
    /// Calls of this router in flight there.
    in_flight: u32,
    /// Calls this router has sent there, each numbered by this count.
    sent: u64,
    /// The replica's ongoing requests besides ours, as it last replied.
    others: Option<Reported<u32>>,
    /// The replica's fullness as it last reported it.
    fullness: Option<Reported<f64>>,
    /// The number of the latest call sent before the one that carried the
    /// fullness report (the report counts it and those before).
    counted_calls: u64,
    full_until: Option<Instant>,
}

/// A figure a replica reported, and when it came.
#[derive(Clone, Copy, Debug)]
struct Reported<T> {
    value: T,
    at: Instant,
}

/// The reported value, unless it is older than [`REPORT_TTL`].
fn fresh<T: Copy>(report: Option<Reported<T>>, now: Instant) -> Option<T> {
    report
        .filter(|report| now - report.at < REPORT_TTL)
        .map(|report| report.value)
}

impl LoadEstimate {
    /// Counts a call sent there; returns its number.
    pub(crate) fn count_call(&mut self) -> u64 {
        self.in_flight += 1;
        self.sent += 1;
        self.sent
    }

    /// A call sent there ended.
    pub(crate) fn end_call(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Takes in the replica's count of ongoing requests, ours among them.
    pub(crate) fn take_ongoing(&mut self, ongoing: u32, now: Instant) {
        self.others = Some(Reported {
            value: ongoing.saturating_sub(self.in_flight),
            at: now,
        });
    }

    /// Takes in the fullness (if it reports one) that call number `call`
    /// brought back.
    pub(crate) fn take_fullness(&mut self, fullness: Option<f64>, call: u64, now: Instant) {
        let Some(value) = fullness else {
            return;
        };
        self.fullness = Some(Reported { value, at: now });
        self.counted_calls = self.counted_calls.max(call);
    }

    /// The replica rejected a request: it counts as full for a while.
    pub(crate) fn rejected(&mut self, now: Instant) {
        self.full_until = Some(now + REJECTED_PAUSE);
    }

    /// Requests ongoing there, as far as this router knows.
    fn ongoing(&self, now: Instant) -> u32 {
        self.in_flight + fresh(self.others, now).unwrap_or(0)
    }

    /// Calls in flight there that the fullness report does not count.
    fn unreported_calls(&self) -> u32 {
        let after_report = self.sent.saturating_sub(self.counted_calls);
        u32::try_from(after_report).unwrap_or(u32::MAX).min(self.in_flight)
    }

    /// How loaded the replica is, as a fraction of its capacity.
    pub(crate) fn estimate(&self, now: Instant, max_ongoing: u32) -> f64 {
        match fresh(self.fullness, now) {
            Some(fullness) => fullness + UNREPORTED_CALL_FULLNESS * f64::from(self.unreported_calls()),
            None => f64::from(self.ongoing(now)) / f64::from(max_ongoing.max(1)),
        }
    }

    /// Whether the replica can take one more request.
    pub(crate) fn has_room(&self, now: Instant, max_ongoing: u32) -> bool {
        self.ongoing(now) < max_ongoing
            && fresh(self.fullness, now).is_none_or(|fullness| fullness < 1.0)
            && self.full_until.is_none_or(|until| now >= until)
    }
}

/// The index in `loads` of the replica to send a request to: of the
/// `sampled` ones with room, the least loaded; if none of them has room,
/// the least loaded with room of all; `None` when none has room.
pub(crate) fn least_loaded(
    loads: &[&LoadEstimate],
    sampled: &[usize],
    now: Instant,
    max_ongoing: u32,
) -> Option<usize> {
    let has_room = |index: &usize| loads[*index].has_room(now, max_ongoing);
    let by_estimate = |a: &usize, b: &usize| {
        let (a, b) = (
            loads[*a].estimate(now, max_ongoing),
            loads[*b].estimate(now, max_ongoing),
        );
        a.total_cmp(&b)
    };
    let sampled = sampled.iter().copied().filter(has_room).min_by(by_estimate);
    sampled.or_else(|| (0..loads.len()).filter(has_room).min_by(by_estimate))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_ONGOING: u32 = 100;

    /// A replica that reported `fullness` with the reply to one call, sent
    /// and ended.
    fn reporting(fullness: f64, now: Instant) -> LoadEstimate {
        let mut load = LoadEstimate::default();
        let call = load.count_call();
        load.take_fullness(Some(fullness), call, now);
        load.end_call();
        load
    }

    fn choice(loads: &[&LoadEstimate], now: Instant) -> Option<usize> {
        least_loaded(loads, &[0, 1], now, MAX_ONGOING)
    }

    #[test]
    fn the_replica_that_reports_itself_emptier_is_chosen() {
        let now = Instant::now();
        let (emptier, fuller) = (reporting(0.2, now), reporting(0.6, now));
        assert_eq!(choice(&[&emptier, &fuller], now), Some(0));
        assert_eq!(choice(&[&fuller, &emptier], now), Some(1));
    }

    #[test]
    fn fullness_outranks_counts_of_requests() {
        let now = Instant::now();
        let mut few_long = reporting(0.9, now);
        few_long.take_ongoing(3, now);
        let mut many_short = reporting(0.3, now);
        many_short.take_ongoing(10, now);
        assert_eq!(choice(&[&few_long, &many_short], now), Some(1));
    }

    #[test]
    fn a_replica_reporting_one_or_more_has_no_room() {
        let now = Instant::now();
        let (full, overloaded, busy) = (reporting(1.0, now), reporting(1.5, now), reporting(0.99, now));
        assert!(!full.has_room(now, MAX_ONGOING));
        assert!(!overloaded.has_room(now, MAX_ONGOING));
        assert_eq!(choice(&[&full, &busy], now), Some(1));
        assert_eq!(choice(&[&full, &overloaded], now), None);
    }

    #[test]
    fn calls_sent_since_a_report_add_a_little_each() {
        let now = Instant::now();
        let mut burst = reporting(0.1, now);
        for _ in 0..10 {
            burst.count_call();
        }
        let estimate = burst.estimate(now, MAX_ONGOING);
        assert!((estimate - 0.3).abs() < 1e-9, "{estimate}");
        let steady = reporting(0.25, now);
        assert_eq!(choice(&[&burst, &steady], now), Some(1));
        assert!(burst.has_room(now, MAX_ONGOING), "only a report makes a replica full");
    }

    #[test]
    fn a_report_counts_the_calls_sent_before_the_call_that_brought_it() {
        let now = Instant::now();
        let mut load = LoadEstimate::default();
        let calls: Vec<u64> = (0..4).map(|_| load.count_call()).collect();
        load.take_fullness(Some(0.5), calls[1], now);
        assert_eq!(load.unreported_calls(), 2);
        load.take_fullness(Some(0.5), calls[3], now);
        assert_eq!(load.unreported_calls(), 0);
        load.take_fullness(Some(0.5), calls[0], now);
        assert_eq!(load.unreported_calls(), 0, "an older call's report counts no fewer");
    }

    #[test]
    fn calls_that_ended_unreported_no_longer_add() {
        let now = Instant::now();
        let mut load = reporting(0.1, now);
        load.count_call();
        load.count_call();
        load.end_call();
        load.end_call();
        assert_eq!(load.unreported_calls(), 0);
    }

    #[test]
    fn a_report_expires_and_the_replica_goes_by_its_calls_again() {
        let now = Instant::now();
        let mut full = reporting(1.0, now);
        full.count_call();
        let later = now + REPORT_TTL;
        assert!(full.has_room(later, MAX_ONGOING));
        assert_eq!(full.estimate(later, MAX_ONGOING), 1.0 / f64::from(MAX_ONGOING));
    }

    #[test]
    fn max_ongoing_requests_bounds_a_replica_with_room_by_its_fullness() {
        let now = Instant::now();
        let mut load = reporting(0.1, now);
        load.take_ongoing(MAX_ONGOING, now);
        assert!(!load.has_room(now, MAX_ONGOING));
    }

    #[test]
    fn replicas_without_reports_go_by_their_ongoing_requests() {
        let now = Instant::now();
        let (mut busy, mut idle) = (LoadEstimate::default(), LoadEstimate::default());
        busy.take_ongoing(4, now);
        idle.take_ongoing(1, now);
        assert_eq!(choice(&[&busy, &idle], now), Some(1));
        busy.take_ongoing(MAX_ONGOING, now);
        idle.take_ongoing(MAX_ONGOING, now);
        assert_eq!(choice(&[&busy, &idle], now), None);
    }

    #[test]
    fn a_replica_that_rejected_rests_for_a_while() {
        let now = Instant::now();
        let mut load = reporting(0.1, now);
        load.rejected(now);
        assert!(!load.has_room(now, MAX_ONGOING));
        assert!(load.has_room(now + REJECTED_PAUSE, MAX_ONGOING));
    }

    #[test]
    fn when_neither_sampled_replica_has_room_the_least_loaded_of_all_is_chosen() {
        let now = Instant::now();
        let (full, also_full) = (reporting(1.0, now), reporting(1.2, now));
        let (busy, light) = (reporting(0.7, now), reporting(0.4, now));
        let loads = [&full, &also_full, &busy, &light];
        assert_eq!(least_loaded(&loads, &[0, 1], now, MAX_ONGOING), Some(3));
    }
}
