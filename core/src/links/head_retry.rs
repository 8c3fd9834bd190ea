//! Calls that need the head wait out a restart of it (`raylet start --head
//! --recover`): a call that finds the head unreachable is tried again every
//! [`HEAD_RETRY`] (jittered, so that a process's many callers do not come
//! back in step), for up to [`HEAD_RESTART_PATIENCE`] from the first failure.

use std::future::Future;
use std::time::{Duration, Instant};

use raylet_common::backoff::jittered;

use crate::{Error, Result};

/// How long a call waits for a head that went away.
pub(crate) const HEAD_RESTART_PATIENCE: Duration = Duration::from_secs(60);
/// How often a head that went away is tried again.
const HEAD_RETRY: Duration = Duration::from_millis(200);

/// A caller's view of a head that stopped answering: it is waited for up
/// to [`HEAD_RESTART_PATIENCE`] from the first failure.
#[derive(Default)]
pub(crate) struct HeadLost {
    since: Option<Instant>,
}

impl HeadLost {
    /// Waits a moment before the next try when `error` says the head is
    /// unreachable and patience is left; else returns the error.
    pub(crate) async fn wait_or_fail(&mut self, error: Error) -> Result<()> {
        let unreachable = matches!(error, Error::Cluster(raylet_proto::Error::Unavailable(_)));
        let first = self.since.is_none();
        let since = *self.since.get_or_insert_with(Instant::now);
        if !unreachable || since.elapsed() > HEAD_RESTART_PATIENCE {
            return Err(error);
        }
        if first {
            tracing::warn!(%error, "the head is unreachable; waiting for it to come back");
        }
        tokio::time::sleep(jittered(HEAD_RETRY)).await;
        Ok(())
    }
}

/// Runs `call` until it succeeds, fails for another reason than an
/// unreachable head, or the head stays away too long. The call must be
/// safe to repeat.
pub(crate) async fn retrying<T, F, Fut>(mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut head_lost = HeadLost::default();
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) => head_lost.wait_or_fail(error).await?,
        }
    }
}
