//! The autoscaling decision for one deployment, apart from any cluster
//! call so that it can be tested with virtual time: samples of the load
//! (requests at replicas plus requests queued in routers) over the look
//! back period give a desired count; a change applies once it has held
//! for its delay, except from zero replicas: a deployment scaled to zero
//! that has requests waiting scales up at once, as Ray Serve's does.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::AutoscalingConfig;
use crate::status::AutoscalingStatus;

/// One deployment's autoscaler.
pub(super) struct Autoscaler {
    config: AutoscalingConfig,
    /// The replica count it aims at.
    current: u32,
    samples: VecDeque<Sample>,
    /// Since when the desired count has differed from `current` in the
    /// same direction.
    pending: Option<Pending>,
    last_sample: Option<Instant>,
}

struct Sample {
    at: Instant,
    load: f64,
    queued: u32,
}

struct Pending {
    desired: u32,
    since: Instant,
}

impl Autoscaler {
    pub(super) fn new(config: AutoscalingConfig) -> Self {
        let current = config.initial_replicas.unwrap_or(config.min_replicas);
        Autoscaler {
            config,
            current,
            samples: VecDeque::new(),
            pending: None,
            last_sample: None,
        }
    }

    /// Takes a new config, keeping the current count within its bounds.
    pub(super) fn reconfigure(&mut self, config: AutoscalingConfig) {
        self.current = self.current.clamp(config.min_replicas, config.max_replicas);
        self.config = config;
        self.pending = None;
    }

    /// The replica count to run now.
    pub(super) fn target(&self) -> u32 {
        self.current
    }

    /// Whether a sample is due at `now`: every metrics interval, and at
    /// once when `queued` requests wait while it runs no replica.
    pub(super) fn sample_due(&self, now: Instant, queued: u32) -> bool {
        let interval_over = self
            .last_sample
            .is_none_or(|last| now.duration_since(last) >= self.config.metrics_interval);
        interval_over || (self.current == 0 && queued > 0)
    }

    /// Records the requests running at replicas and waiting in routers,
    /// then decides.
    pub(super) fn record(&mut self, now: Instant, ongoing: u32, queued: u32) {
        self.last_sample = Some(now);
        self.samples.push_back(Sample {
            at: now,
            load: f64::from(ongoing + queued),
            queued,
        });
        let look_back = self.config.look_back_period.max(self.config.metrics_interval);
        while self
            .samples
            .front()
            .is_some_and(|oldest| now.duration_since(oldest.at) > look_back)
        {
            self.samples.pop_front();
        }
        self.decide(now);
    }

    fn average_load(&self) -> f64 {
        match self.samples.len() {
            0 => 0.0,
            count => self.samples.iter().map(|sample| sample.load).sum::<f64>() / count as f64,
        }
    }

    fn desired(&self) -> u32 {
        let wanted = (self.average_load() / self.config.target_ongoing_requests).ceil() as u32;
        wanted.clamp(self.config.min_replicas, self.config.max_replicas)
    }

    fn decide(&mut self, now: Instant) {
        let desired = self.desired();
        if desired == self.current || self.current == 0 {
            self.current = desired;
            self.pending = None;
            return;
        }
        let same_direction = self
            .pending
            .as_ref()
            .is_some_and(|pending| (pending.desired > self.current) == (desired > self.current));
        if !same_direction {
            self.pending = Some(Pending { desired, since: now });
        }
        let since = self.pending.as_ref().map_or(now, |pending| pending.since);
        self.pending = Some(Pending { desired, since });
        if now.duration_since(since) >= self.delay_towards(desired) {
            self.current = desired;
            self.pending = None;
        }
    }

    fn delay_towards(&self, desired: u32) -> Duration {
        match desired > self.current {
            true => self.config.upscale_delay,
            false => self.config.downscale_delay,
        }
    }

    /// Its inputs and decision, for the status.
    pub(super) fn status(&self, now: Instant) -> AutoscalingStatus {
        let decision = match &self.pending {
            None => format!("holding at {}", self.current),
            Some(pending) => {
                let held = now.duration_since(pending.since);
                let delay = self.delay_towards(pending.desired);
                let direction = if pending.desired > self.current { "up" } else { "down" };
                format!(
                    "scale {direction} to {} in {:.1} s (held {:.1} s of {:.1} s)",
                    pending.desired,
                    delay.saturating_sub(held).as_secs_f64(),
                    held.as_secs_f64(),
                    delay.as_secs_f64()
                )
            }
        };
        AutoscalingStatus {
            min_replicas: self.config.min_replicas,
            max_replicas: self.config.max_replicas,
            target_ongoing_requests: self.config.target_ongoing_requests,
            current: self.current,
            desired: self.desired(),
            average_ongoing: self.average_load(),
            queued: self.samples.back().map_or(0, |sample| sample.queued),
            decision,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AutoscalingConfig {
        AutoscalingConfig {
            min_replicas: 1,
            max_replicas: 3,
            initial_replicas: None,
            target_ongoing_requests: 2.0,
            upscale_delay: Duration::from_secs(1),
            downscale_delay: Duration::from_secs(5),
            metrics_interval: Duration::from_millis(500),
            look_back_period: Duration::from_secs(1),
        }
    }

    /// Feeds one sample every 500 ms for `seconds` from `from`; returns
    /// the end.
    fn feed(scaler: &mut Autoscaler, start: Instant, from: f64, seconds: f64, ongoing: u32, queued: u32) -> Instant {
        let mut at = start + Duration::from_secs_f64(from);
        let end = start + Duration::from_secs_f64(from + seconds);
        while at < end {
            scaler.record(at, ongoing, queued);
            at += Duration::from_millis(500);
        }
        end
    }

    #[test]
    fn scales_up_after_the_upscale_delay_and_down_after_the_downscale_delay() {
        let start = Instant::now();
        let mut scaler = Autoscaler::new(config());
        assert_eq!(scaler.target(), 1);
        feed(&mut scaler, start, 0.0, 0.9, 6, 0);
        assert_eq!(scaler.target(), 1, "the upscale has not held 1 s yet");
        feed(&mut scaler, start, 0.9, 1.0, 6, 0);
        assert_eq!(scaler.target(), 3, "6 ongoing at 2 per replica is 3 replicas");
        feed(&mut scaler, start, 1.9, 4.0, 0, 0);
        assert_eq!(scaler.target(), 3, "the downscale waits 5 s");
        feed(&mut scaler, start, 5.9, 3.0, 0, 0);
        assert_eq!(scaler.target(), 1, "idle for over 5 s goes back to the minimum");
    }

    #[test]
    fn queued_requests_count_and_the_maximum_bounds_the_count() {
        let start = Instant::now();
        let mut scaler = Autoscaler::new(config());
        feed(&mut scaler, start, 0.0, 3.0, 2, 40);
        assert_eq!(scaler.target(), 3, "42 requests want 21 replicas, the maximum is 3");
        let status = scaler.status(start + Duration::from_secs(3));
        assert_eq!(status.desired, 3);
        assert_eq!(status.queued, 40);
        assert_eq!(status.decision, "holding at 3");
    }

    #[test]
    fn a_deployment_scaled_to_zero_starts_at_once_and_goes_back_to_zero_when_idle() {
        let start = Instant::now();
        let to_zero = AutoscalingConfig {
            min_replicas: 0,
            ..config()
        };
        let mut scaler = Autoscaler::new(to_zero);
        assert_eq!(scaler.target(), 0, "it starts at its minimum");
        feed(&mut scaler, start, 0.0, 2.0, 0, 0);
        assert_eq!(scaler.target(), 0);
        let arrival = start + Duration::from_millis(1600);
        assert!(!scaler.sample_due(arrival, 0), "nothing waits: the interval holds");
        assert!(scaler.sample_due(arrival, 1), "a waiting request is sampled at once");
        scaler.record(arrival, 0, 1);
        assert_eq!(scaler.target(), 1, "no upscale delay from zero");
        feed(&mut scaler, start, 2.5, 4.0, 0, 0);
        assert_eq!(scaler.target(), 1, "the downscale waits 5 s");
        feed(&mut scaler, start, 6.5, 3.0, 0, 0);
        assert_eq!(scaler.target(), 0, "idle for over 5 s goes back to zero");
    }

    #[test]
    fn a_spike_shorter_than_the_delay_changes_nothing() {
        let start = Instant::now();
        let short_look_back = AutoscalingConfig {
            look_back_period: Duration::from_millis(500),
            ..config()
        };
        let mut scaler = Autoscaler::new(short_look_back);
        feed(&mut scaler, start, 0.0, 0.5, 6, 0);
        feed(&mut scaler, start, 0.5, 2.0, 1, 0);
        assert_eq!(scaler.target(), 1);
        let status = scaler.status(start + Duration::from_millis(2500));
        assert_eq!(status.decision, "holding at 1");
    }
}
