//! A server's event stream to one peer, with a bound. Events wait for the
//! peer up to [`PEER_QUEUE_BOUND`]; a peer that lets more pile up has
//! stopped reading, so the server says who it is in its log and ends the
//! stream, instead of keeping every event for it in memory. A producer that
//! can wait (one reading a file) waits for room instead, up to
//! [`PEER_PATIENCE`].

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_stream::Stream;
use tonic::Status;

/// Events that may wait for one peer.
pub const PEER_QUEUE_BOUND: usize = 4096;
/// How long a peer may leave a full queue unread before a producer that
/// waits for room cuts it off.
pub const PEER_PATIENCE: Duration = Duration::from_secs(30);

/// The stream ended: the peer left, or it stopped reading and was cut off.
#[derive(Debug, thiserror::Error)]
#[error("the peer's stream has ended")]
pub struct PeerGone;

/// The sending end; clones feed the same stream.
pub struct PeerSender<T> {
    queue: mpsc::Sender<Result<T, Status>>,
    cut_off: Arc<AtomicBool>,
    /// What the stream is and who reads it, for the log.
    stream: &'static str,
    peer: Arc<str>,
}

impl<T> Clone for PeerSender<T> {
    fn clone(&self) -> Self {
        PeerSender {
            queue: self.queue.clone(),
            cut_off: self.cut_off.clone(),
            stream: self.stream,
            peer: self.peer.clone(),
        }
    }
}

impl<T> PeerSender<T> {
    /// Queues an event for the peer. A full queue cuts the peer off: the
    /// event is dropped, the stream ends, and the log names the peer.
    pub fn send(&self, event: Result<T, Status>) -> Result<(), PeerGone> {
        if self.cut_off.load(Ordering::Acquire) {
            return Err(PeerGone);
        }
        match self.queue.try_send(event) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(PeerGone),
            Err(TrySendError::Full(_)) => Err(self.cut_off()),
        }
    }

    /// Queues an event once there is room, for a producer that can wait; a
    /// peer that makes no room within [`PEER_PATIENCE`] is cut off.
    pub async fn send_when_room(&self, event: Result<T, Status>) -> Result<(), PeerGone> {
        self.send_within(event, PEER_PATIENCE).await
    }

    async fn send_within(&self, event: Result<T, Status>, patience: Duration) -> Result<(), PeerGone> {
        if self.cut_off.load(Ordering::Acquire) {
            return Err(PeerGone);
        }
        match tokio::time::timeout(patience, self.queue.reserve()).await {
            Ok(Ok(room)) => {
                room.send(event);
                Ok(())
            }
            Ok(Err(_closed)) => Err(PeerGone),
            Err(_elapsed) => Err(self.cut_off()),
        }
    }

    /// Ends the stream of a peer that stopped reading, saying so once.
    fn cut_off(&self) -> PeerGone {
        if !self.cut_off.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                stream = self.stream,
                peer = %self.peer,
                bound = PEER_QUEUE_BOUND,
                "a peer stopped reading its stream; disconnecting it"
            );
        }
        PeerGone
    }
}

/// The receiving end, which the server returns as its response stream.
pub struct PeerStream<T> {
    queue: mpsc::Receiver<Result<T, Status>>,
    cut_off: Arc<AtomicBool>,
    /// Whether the peer was told why its stream ends.
    told: bool,
}

impl<T> Stream for PeerStream<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.cut_off.load(Ordering::Acquire) {
            if self.told {
                return Poll::Ready(None);
            }
            self.told = true;
            let message = format!("this stream fell {PEER_QUEUE_BOUND} events behind; the server ended it");
            return Poll::Ready(Some(Err(Status::resource_exhausted(message))));
        }
        self.queue.poll_recv(cx)
    }
}

/// A bounded stream of events for `peer`; `stream` says what it carries.
pub fn peer_stream<T>(stream: &'static str, peer: impl Into<Arc<str>>) -> (PeerSender<T>, PeerStream<T>) {
    let (queue, receiver) = mpsc::channel(PEER_QUEUE_BOUND);
    let cut_off = Arc::new(AtomicBool::new(false));
    let sender = PeerSender {
        queue,
        cut_off: cut_off.clone(),
        stream,
        peer: peer.into(),
    };
    let stream = PeerStream {
        queue: receiver,
        cut_off,
        told: false,
    };
    (sender, stream)
}

/// Who sent a request, for naming it in the log.
pub fn peer_of<R>(request: &tonic::Request<R>) -> String {
    raylet_common::connection_admission::connection_of(request.extensions())
        .and_then(|connection| connection.remote_addr())
        .map_or_else(|| "an unknown peer".to_string(), |address| address.to_string())
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_peer_that_stops_reading_is_cut_off_at_the_bound_and_told_why() {
        let (sender, mut stream) = peer_stream::<u32>("test events", "127.0.0.1:9");
        for event in 0..PEER_QUEUE_BOUND as u32 {
            sender.send(Ok(event)).unwrap();
        }
        assert!(sender.send(Ok(0)).is_err(), "one more is past the bound");
        assert!(sender.clone().send(Ok(1)).is_err(), "every clone sees the end");
        let ended = stream.next().await.unwrap().unwrap_err();
        assert_eq!(ended.code(), tonic::Code::ResourceExhausted);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_waiting_producer_sends_once_the_peer_reads_and_cuts_off_one_that_never_does() {
        let (sender, mut stream) = peer_stream::<u32>("test events", "127.0.0.1:9");
        for event in 0..PEER_QUEUE_BOUND as u32 {
            sender.send(Ok(event)).unwrap();
        }
        let waiting = sender.send_within(Ok(PEER_QUEUE_BOUND as u32), Duration::from_secs(600));
        let (sent, read) = tokio::join!(waiting, stream.next());
        assert!(sent.is_ok(), "reading one event made room");
        assert_eq!(read.unwrap().unwrap(), 0);
        assert!(sender.send_within(Ok(0), Duration::from_millis(10)).await.is_err());
        let ended = stream.next().await.unwrap().unwrap_err();
        assert_eq!(ended.code(), tonic::Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn a_peer_that_reads_gets_every_event_in_order() {
        let (sender, stream) = peer_stream::<u32>("test events", "127.0.0.1:9");
        let reader = tokio::spawn(stream.take(3 * PEER_QUEUE_BOUND).collect::<Vec<_>>());
        for event in 0..3 * PEER_QUEUE_BOUND as u32 {
            sender.send(Ok(event)).expect("a reading peer is never cut off");
            tokio::task::yield_now().await;
        }
        let events: Vec<u32> = reader.await.unwrap().into_iter().map(Result::unwrap).collect();
        assert_eq!(events, (0..3 * PEER_QUEUE_BOUND as u32).collect::<Vec<_>>());
    }
}
