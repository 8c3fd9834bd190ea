//! The getter's end: connections to each owner on this machine, kept for
//! reuse, each used by one thread at a time, which writes its request and
//! reads the answer itself.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use raylet_common::auth::AuthToken;

use crate::ids::ObjectId;
use crate::task_stream::{FrameBuffer, Reading, SPIN, encode_frame, hello, welcomed};
use crate::v1::{GetObjectReply, GetObjectRequest, ObjectOutcome, TaskStreamWelcome};
use crate::{Error, Result, local_socket};

/// How long a getter waits for an owner's answer, which the owner gives
/// at once; past it, the connection is dropped and the get takes gRPC.
const ANSWER_PATIENCE: Duration = Duration::from_secs(5);

/// Idle connections kept per owner; more are closed as they come back.
const MAX_IDLE_PER_OWNER: usize = 16;
/// Owners remembered at most: past it the table starts afresh (closing
/// the idle connections), so that a long-lived process that got from many
/// short-lived owners does not keep one entry for each.
const MAX_OWNERS: usize = 4096;

/// The owners this process got from, by their gRPC address.
pub struct LocalGets {
    token: AuthToken,
    owners: Mutex<HashMap<String, OwnerLink>>,
}

/// How this process reaches an owner's gets.
enum OwnerLink {
    /// Not through a same-node socket: none there, or it refused us.
    Remote,
    /// Through these connections, none in use.
    Idle(Vec<Connection>),
}

impl LocalGets {
    pub fn new(token: AuthToken) -> Self {
        LocalGets {
            token,
            owners: Mutex::default(),
        }
    }

    /// `object`'s outcome from its owner at `owner`, when the owner runs on
    /// this machine and has it finished; `None` means ask the owner over
    /// gRPC (not on this machine, not finished, or the socket failed).
    pub fn finished(&self, owner: &str, object: ObjectId) -> Option<ObjectOutcome> {
        let mut connection = self.connection(owner)?;
        match connection.ask(object) {
            Ok(outcome) => {
                self.put_back(owner, connection);
                outcome
            }
            Err(error) => {
                tracing::debug!(%owner, %error, "a same-node get failed; asking over gRPC");
                None
            }
        }
    }

    fn owners(&self) -> MutexGuard<'_, HashMap<String, OwnerLink>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection to `owner`, or a new one; `None` when the owner
    /// has no same-node socket, which is remembered.
    fn connection(&self, owner: &str) -> Option<Connection> {
        match self.owners().get_mut(owner) {
            Some(OwnerLink::Remote) => return None,
            Some(OwnerLink::Idle(idle)) if !idle.is_empty() => return idle.pop(),
            _ => {}
        }
        match Connection::open(owner, &self.token) {
            Ok(connection) => Some(connection),
            Err(error) => {
                tracing::debug!(%owner, %error, "gets from this owner take gRPC");
                self.remember(owner, OwnerLink::Remote);
                None
            }
        }
    }

    fn put_back(&self, owner: &str, connection: Connection) {
        let mut owners = self.owners();
        match owners.get_mut(owner) {
            Some(OwnerLink::Idle(idle)) if idle.len() < MAX_IDLE_PER_OWNER => idle.push(connection),
            Some(_) => {}
            None => {
                drop(owners);
                self.remember(owner, OwnerLink::Idle(vec![connection]));
            }
        }
    }

    /// Records how `owner` is reached, within [`MAX_OWNERS`].
    fn remember(&self, owner: &str, link: OwnerLink) {
        let mut owners = self.owners();
        if owners.len() >= MAX_OWNERS {
            owners.clear();
        }
        owners.insert(owner.to_string(), link);
    }
}

/// A connection to one owner's gets.
struct Connection {
    socket: UnixStream,
    frames: FrameBuffer,
}

impl Connection {
    /// Connects to the socket beside `owner`'s gRPC port and opens it with
    /// the cluster's token.
    fn open(owner: &str, token: &AuthToken) -> Result<Self> {
        let address: SocketAddr = owner
            .parse()
            .map_err(|e| Error::InvalidArgument(format!("owner address {owner}: {e}")))?;
        let path =
            local_socket::socket_for(address).ok_or_else(|| Error::Unavailable("no same-node socket folder".into()))?;
        let socket = UnixStream::connect(path)?;
        socket.set_nonblocking(true)?;
        let mut connection = Connection {
            socket,
            frames: FrameBuffer::opening(),
        };
        connection.send(&encode_frame(&hello(token)))?;
        welcomed(connection.answer::<TaskStreamWelcome>()?)?;
        connection.frames.admit();
        Ok(connection)
    }

    /// The owner's answer for `object`: its outcome if finished.
    fn ask(&mut self, object: ObjectId) -> Result<Option<ObjectOutcome>> {
        let request = GetObjectRequest {
            object_id: object.as_bytes().to_vec(),
            timeout_ms: 0,
        };
        self.send(&encode_frame(&request))?;
        Ok(self.answer::<GetObjectReply>()?.outcome)
    }

    /// Writes a whole frame; the socket has room, as the owner answered
    /// every frame before.
    fn send(&mut self, frame: &[u8]) -> Result<()> {
        Ok(self.socket.write_all(frame)?)
    }

    /// Reads the next frame: polling for [`SPIN`], then sleeping until it
    /// comes, for up to [`ANSWER_PATIENCE`].
    fn answer<M: prost::Message + Default>(&mut self) -> Result<M> {
        let started = Instant::now();
        loop {
            let read = self.frames.read_some(&self.socket)?;
            if let Some(message) = self.frames.next_message()? {
                return Ok(message);
            }
            match read {
                Reading::More => continue,
                Reading::Ended => return Err(Error::Unavailable("the owner closed its same-node socket".into())),
                Reading::Drained => {}
            }
            let waited = started.elapsed();
            if waited < SPIN {
                std::thread::yield_now();
            } else if waited < ANSWER_PATIENCE {
                wait_readable(&self.socket, ANSWER_PATIENCE - waited);
            } else {
                return Err(Error::DeadlineExceeded(format!(
                    "the owner did not answer a same-node get within {ANSWER_PATIENCE:?}"
                )));
            }
        }
    }
}

/// Sleeps until `socket` has something to read or `timeout` passes.
fn wait_readable(socket: &UnixStream, timeout: Duration) {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: one pollfd, valid for the call; the descriptor is open.
    unsafe { libc::poll(&mut poll, 1, millis) };
}
