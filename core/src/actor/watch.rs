//! One stream per process to the head that follows every actor the process
//! calls. Each actor client asks to be followed; the records the head sends
//! go to the client of their actor, until the actor is dead. A head that
//! goes away is waited for as calls to it are ([`HeadLost`]): the stream is
//! then opened again and every actor still followed is asked for anew.
//! (One stream per actor ran into the cap on streams per HTTP/2
//! connection: a driver stalled at its 1,025th actor.)

use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt;
use raylet_proto::v1::{ActorState, ActorWatchEvent, WatchActorRequest};
use raylet_proto::{ActorId, IdMap};
use tokio::sync::mpsc;

use super::client::{ActorClient, ActorClients};
use crate::Error;
use crate::context::Context;
use crate::links::Incoming;
use crate::links::head_retry::HeadLost;

/// The actors this process follows, and the stream that follows them.
#[derive(Default)]
pub(super) struct ActorWatch {
    state: Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    /// The client of each actor followed, until the actor is dead.
    followed: IdMap<ActorId, Arc<ActorClient>>,
    /// The open stream's requests; `None` while it opens again.
    requests: Option<mpsc::UnboundedSender<WatchActorRequest>>,
    /// Whether the task that keeps the stream open runs.
    running: bool,
}

impl ActorWatch {
    fn state(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows `client`'s actor until it is dead, opening the stream on
    /// first use.
    pub(super) fn follow(&self, clients: &Arc<ActorClients>, client: Arc<ActorClient>) {
        let actor = client.actor();
        let mut state = self.state();
        state.followed.insert(actor, client);
        if let Some(requests) = &state.requests {
            let _ = requests.send(follow_request(actor));
        }
        if !state.running {
            state.running = true;
            clients.spawn_until_closed(keep_watching(clients.clone()));
        }
    }

    /// Opens the stream, asks for every actor followed, and hands out the
    /// records until the stream ends, which counts as the head gone away.
    async fn watch_once(&self, ctx: &Context, head_lost: &mut HeadLost) -> Error {
        // One request per actor followed.
        let (requests, outbound) = mpsc::unbounded_channel();
        {
            let mut state = self.state();
            for actor in state.followed.keys() {
                let _ = requests.send(follow_request(*actor));
            }
            state.requests = Some(requests);
        }
        let error = match ctx.links.head.watch_actors(outbound).await {
            Ok(events) => {
                *head_lost = HeadLost::default();
                self.hand_out(events).await
            }
            Err(error) => error,
        };
        self.state().requests = None;
        error
    }

    /// Hands each record to its actor's client until the stream ends.
    async fn hand_out(&self, mut events: Incoming<ActorWatchEvent>) -> Error {
        let gone = |why: String| Error::Cluster(raylet_proto::Error::Unavailable(why));
        loop {
            match events.next().await {
                Some(Ok(event)) => self.on_event(event),
                None => return gone("the head stopped reporting on actors".into()),
                Some(Err(error)) => return gone(format!("the head's report broke off ({error})")),
            }
        }
    }

    fn on_event(&self, event: ActorWatchEvent) {
        let Ok(actor) = ActorId::from_wire(&event.actor_id) else {
            return;
        };
        let Some(client) = self.state().followed.get(&actor).cloned() else {
            return;
        };
        match event.record {
            Some(record) => {
                let dead = record.state() == ActorState::Dead;
                client.on_record(record);
                if dead {
                    self.state().followed.remove(&actor);
                }
            }
            None => {
                self.state().followed.remove(&actor);
                client.records_ended(format!("the head cannot report on it ({})", event.error));
            }
        }
    }

    /// The head stayed away too long: every actor followed is unknown.
    fn give_up(&self, error: &Error) {
        let clients: Vec<Arc<ActorClient>> = {
            let mut state = self.state();
            state.running = false;
            state.requests = None;
            state.followed.drain().map(|(_, client)| client).collect()
        };
        for client in clients {
            client.records_ended(format!("the head cannot report on it ({error})"));
        }
    }
}

fn follow_request(actor: ActorId) -> WatchActorRequest {
    WatchActorRequest {
        actor_id: actor.as_bytes().to_vec(),
    }
}

/// Keeps the stream open while actors are followed and the head answers
/// within its restart patience.
async fn keep_watching(clients: Arc<ActorClients>) {
    let watch = &clients.watch;
    let mut head_lost = HeadLost::default();
    loop {
        let error = watch.watch_once(&clients.owner.ctx, &mut head_lost).await;
        if let Err(error) = head_lost.wait_or_fail(error).await {
            watch.give_up(&error);
            return;
        }
    }
}
