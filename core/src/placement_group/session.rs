//! This process's placement group calls to the head. Creates and
//! removes go as messages on one long-lived stream and are answered by call
//! id, so a burst of groups costs no unary round trip each. The stream is
//! opened on first use and again after it breaks; a call that finds the
//! head gone waits for it to come back (both calls are safe to repeat).
//! Waiting for a group to settle is one unary call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raylet_proto::PlacementGroupId;
use raylet_proto::v1::placement_group_answer::Kind as AnswerKind;
use raylet_proto::v1::placement_group_call::Kind as CallKind;
use raylet_proto::v1::placement_group_service_client::PlacementGroupServiceClient;
use raylet_proto::v1::{PlacementGroupAnswer, PlacementGroupCall, PlacementGroupRecord, WaitPlacementGroupRequest};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::context::Context;
use crate::links::head_retry::retrying;
use crate::{Error, Result};

type Answer = raylet_proto::Result<PlacementGroupRecord>;

/// The session, opened on first use.
#[derive(Default)]
pub(crate) struct GroupSession {
    link: tokio::sync::Mutex<Option<Arc<SessionLink>>>,
    next_call: AtomicU64,
}

/// One open stream: where calls go and who waits for which answer. The
/// waiting map is `None` once the stream has ended.
struct SessionLink {
    calls: mpsc::UnboundedSender<PlacementGroupCall>,
    waiting: Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>,
}

impl GroupSession {
    /// Sends one call and waits for the head's answer, waiting out a
    /// restart of the head.
    pub(crate) async fn call(&self, ctx: &Context, kind: CallKind) -> Result<PlacementGroupRecord> {
        retrying(|| self.call_once(ctx, kind.clone())).await
    }

    async fn call_once(&self, ctx: &Context, kind: CallKind) -> Result<PlacementGroupRecord> {
        let link = self.link(ctx).await?;
        let call_id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        link.wait_for(call_id, answer)?;
        let call = PlacementGroupCall {
            call_id,
            kind: Some(kind),
        };
        if link.calls.send(call).is_err() {
            link.end();
        }
        Ok(answered.await.unwrap_or_else(|_| Err(session_ended()))?)
    }

    /// The open stream, opened anew when there is none or it ended.
    async fn link(&self, ctx: &Context) -> Result<Arc<SessionLink>> {
        let mut link = self.link.lock().await;
        if let Some(open) = link.as_ref().filter(|open| open.is_open()) {
            return Ok(open.clone());
        }
        let opened = SessionLink::open(ctx).await?;
        *link = Some(opened.clone());
        Ok(opened)
    }
}

impl SessionLink {
    async fn open(ctx: &Context) -> Result<Arc<Self>> {
        let channel = ctx.channel(&ctx.head_address).await?;
        // Each call waits for its answer, so at most one per waiting thread
        // is queued here.
        let (calls, outbound) = mpsc::unbounded_channel();
        let reply = PlacementGroupServiceClient::new(channel)
            .placement_group_session(UnboundedReceiverStream::new(outbound))
            .await;
        let mut answers = reply.map_err(raylet_proto::Error::from)?.into_inner();
        let link = Arc::new(SessionLink {
            calls,
            waiting: Mutex::new(Some(HashMap::new())),
        });
        let reader = link.clone();
        tokio::spawn(async move {
            while let Ok(Some(answer)) = answers.message().await {
                reader.answer(answer);
            }
            reader.end();
        });
        Ok(link)
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Option<HashMap<u64, oneshot::Sender<Answer>>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_open(&self) -> bool {
        self.waiting().is_some()
    }

    fn wait_for(&self, call_id: u64, answer: oneshot::Sender<Answer>) -> Result<()> {
        let mut waiting = self.waiting();
        let waiting = waiting.as_mut().ok_or_else(|| Error::from(session_ended()))?;
        waiting.insert(call_id, answer);
        Ok(())
    }

    fn answer(&self, answer: PlacementGroupAnswer) {
        let waiter = self.waiting().as_mut().and_then(|w| w.remove(&answer.call_id));
        let outcome = match answer.kind {
            Some(AnswerKind::Record(record)) => Ok(record),
            Some(AnswerKind::Failure(failure)) => Err(failure.into()),
            None => Err(raylet_proto::Error::Internal(format!(
                "the head answered placement group call {} with nothing",
                answer.call_id
            ))),
        };
        if let Some(waiter) = waiter {
            let _ = waiter.send(outcome);
        }
    }

    /// Fails every call still waiting; the next call opens a new stream.
    fn end(&self) {
        let waiting = self.waiting().take().unwrap_or_default();
        for (_, waiter) in waiting {
            let _ = waiter.send(Err(session_ended()));
        }
    }
}

fn session_ended() -> raylet_proto::Error {
    raylet_proto::Error::Unavailable("the placement group session with the head ended; try again".into())
}

async fn client(ctx: &Context) -> Result<PlacementGroupServiceClient<raylet_proto::channel::AuthedChannel>> {
    Ok(PlacementGroupServiceClient::new(ctx.channel(&ctx.head_address).await?))
}

/// The group's record once it settles or `timeout` passes; a restart of
/// the head is waited out.
pub(crate) async fn wait_for_group(
    ctx: &Context,
    id: PlacementGroupId,
    timeout: Duration,
) -> Result<PlacementGroupRecord> {
    let request = WaitPlacementGroupRequest {
        placement_group_id: id.as_bytes().to_vec(),
        timeout_ms: timeout.as_millis() as u64,
    };
    retrying(|| async {
        let reply = client(ctx).await?.wait_placement_group(request.clone()).await;
        Ok(reply.map_err(raylet_proto::Error::from)?.into_inner())
    })
    .await
}
