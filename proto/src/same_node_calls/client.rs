//! The caller's end: one connection, used by one thread at a time, which
//! writes its request and reads the answer itself.

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use raylet_common::auth::AuthToken;

use crate::task_stream::{FrameBuffer, Reading, SPIN, encode_frame, hello, welcomed};
use crate::v1::TaskStreamWelcome;
use crate::{Error, Result, local_socket};

/// How long a caller waits for an answer, which the server gives at once;
/// past it, the caller drops the connection and takes gRPC.
const ANSWER_PATIENCE: Duration = Duration::from_secs(5);

/// A connection to the same-node calls of the process whose gRPC port is
/// at an address.
pub struct CallConnection {
    socket: UnixStream,
    frames: FrameBuffer,
}

impl CallConnection {
    /// Connects to the socket beside the gRPC port `address` and opens it
    /// with the cluster's token.
    pub fn open(address: &str, token: &AuthToken) -> Result<Self> {
        let address: SocketAddr = address
            .parse()
            .map_err(|e| Error::InvalidArgument(format!("address {address}: {e}")))?;
        let path =
            local_socket::socket_for(address).ok_or_else(|| Error::Unavailable("no same-node socket folder".into()))?;
        let socket = UnixStream::connect(path)?;
        socket.set_nonblocking(true)?;
        let mut connection = CallConnection {
            socket,
            frames: FrameBuffer::opening(),
        };
        connection.send(&encode_frame(&hello(token)))?;
        welcomed(connection.answer::<TaskStreamWelcome>()?)?;
        connection.frames.admit();
        Ok(connection)
    }

    /// The server's reply to `request`.
    pub fn call<Reply: prost::Message + Default>(&mut self, request: &impl prost::Message) -> Result<Reply> {
        self.send(&encode_frame(request))?;
        self.answer()
    }

    /// Writes a whole frame, waiting for room as the server reads a large
    /// one, for up to [`ANSWER_PATIENCE`].
    fn send(&mut self, frame: &[u8]) -> Result<()> {
        let started = Instant::now();
        let mut written = 0;
        while written < frame.len() {
            match self.socket.write(&frame[written..]) {
                Ok(count) => written += count,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    let waited = started.elapsed();
                    if waited >= ANSWER_PATIENCE {
                        return Err(Error::DeadlineExceeded(format!(
                            "the server read no part of a same-node call within {ANSWER_PATIENCE:?}"
                        )));
                    }
                    wait_for(&self.socket, libc::POLLOUT, ANSWER_PATIENCE - waited);
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
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
                Reading::Ended => return Err(Error::Unavailable("the server closed its same-node socket".into())),
                Reading::Drained => {}
            }
            let waited = started.elapsed();
            if waited < SPIN {
                std::thread::yield_now();
            } else if waited < ANSWER_PATIENCE {
                wait_for(&self.socket, libc::POLLIN, ANSWER_PATIENCE - waited);
            } else {
                return Err(Error::DeadlineExceeded(format!(
                    "no answer to a same-node call within {ANSWER_PATIENCE:?}"
                )));
            }
        }
    }
}

/// Sleeps until `socket` is ready for `events` (`POLLIN` or `POLLOUT`) or
/// `timeout` passes.
fn wait_for(socket: &UnixStream, events: libc::c_short, timeout: Duration) {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events,
        revents: 0,
    };
    let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: one pollfd, valid for the call; the descriptor is open.
    unsafe { libc::poll(&mut poll, 1, millis) };
}
