//! A task stream's frames: a message's length, big-endian, then its bytes.
//! [`FrameBuffer`] cuts them out of the bytes read so far, refusing a
//! length over the limit before its bytes arrive; [`FrameReader`] reads
//! them from a socket, through the async runtime or, for a same-node
//! socket handed to [`super::local_reader`], on its thread.

use std::cell::RefCell;
use std::io::Read;
use std::marker::PhantomData;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, Interest};

use super::local_reader::LocalStream;
use crate::server::MAX_DATA_MESSAGE;
use crate::{Error, Result};

const LENGTH_PREFIX: usize = 4;
/// What a reader sets aside at most before a frame's bytes arrive, so that
/// a bogus length does not allocate a gigabyte.
const MAX_RESERVE: usize = 1 << 20;
/// The largest opening frame: a token and a version, or a refusal. Until a
/// stream is admitted, a peer cannot make either side set aside more.
const MAX_OPENING_FRAME: usize = 64 << 10;
/// Bytes read from a same-node socket at a time.
const READ_CHUNK: usize = 64 << 10;
/// Bytes read from a same-node socket before its frames are handed over.
const READ_BUDGET: usize = 1 << 20;

/// A message as a frame.
pub(crate) fn encode_frame(message: &impl Message) -> Vec<u8> {
    let length = message.encoded_len();
    let mut frame = Vec::with_capacity(LENGTH_PREFIX + length);
    frame.put_u32(length as u32);
    message.encode(&mut frame).expect("a Vec grows to fit the message");
    frame
}

/// The messages a stream's reader hands over for `chunks` of bytes, as
/// they arrive one read at a time from an admitted peer: the whole frames
/// in order, then the error that ends the stream, if any (the
/// `task_stream_frames` fuzz target drives it).
pub fn messages_of<M: Message + Default>(chunks: &[&[u8]]) -> (Vec<M>, Option<Error>) {
    let mut frames = FrameBuffer::opening();
    frames.admit();
    let mut messages = Vec::new();
    for chunk in chunks {
        frames.extend(chunk);
        loop {
            match frames.next_message() {
                Ok(Some(message)) => messages.push(message),
                Ok(None) => break,
                Err(error) => return (messages, Some(error)),
            }
        }
    }
    let end = frames.ended::<M>().err();
    (messages, end)
}

/// The bytes read from a stream and not yet taken as frames.
pub(crate) struct FrameBuffer {
    bytes: BytesMut,
    max_frame: usize,
    /// The peer closed the stream: what is left is all there will be.
    peer_closed: bool,
}

impl FrameBuffer {
    /// A buffer that takes only an opening frame until [`Self::admit`].
    pub(crate) fn opening() -> Self {
        FrameBuffer {
            bytes: BytesMut::new(),
            max_frame: MAX_OPENING_FRAME,
            peer_closed: false,
        }
    }

    /// Takes frames up to [`MAX_DATA_MESSAGE`] from now on.
    pub(crate) fn admit(&mut self) {
        self.max_frame = MAX_DATA_MESSAGE;
    }

    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// The next whole message, if its bytes are all here.
    pub(crate) fn next_message<T: Message + Default>(&mut self) -> Result<Option<T>> {
        let Some(frame) = self.next_frame()? else {
            return Ok(None);
        };
        let message =
            T::decode(frame).map_err(|e| Error::InvalidArgument(format!("a task stream frame is garbled: {e}")))?;
        Ok(Some(message))
    }

    /// The next message read from `socket`; `None` once it ended between
    /// frames.
    pub(super) async fn read_message<T: Message + Default>(
        &mut self,
        socket: &mut (impl AsyncRead + Unpin),
    ) -> Result<Option<T>> {
        loop {
            if let Some(message) = self.next_message()? {
                return Ok(Some(message));
            }
            if socket.read_buf(&mut self.bytes).await? == 0 {
                return self.ended();
            }
        }
    }

    /// What the end of the stream means here: a clean end between frames,
    /// or an error inside one.
    pub(crate) fn ended<T>(&self) -> Result<Option<T>> {
        match self.bytes.is_empty() {
            true => Ok(None),
            false => Err(Error::Unavailable("the task stream ended inside a frame".into())),
        }
    }

    fn next_frame(&mut self) -> Result<Option<Bytes>> {
        let Some(prefix) = self.bytes.get(..LENGTH_PREFIX) else {
            return Ok(None);
        };
        let length = u32::from_be_bytes(prefix.try_into().expect("four bytes")) as usize;
        if length > self.max_frame {
            return Err(Error::InvalidArgument(format!(
                "a task stream frame of {length} bytes is over the limit of {}",
                self.max_frame
            )));
        }
        let missing = (LENGTH_PREFIX + length).saturating_sub(self.bytes.len());
        if missing > 0 {
            self.bytes.reserve(missing.min(MAX_RESERVE));
            return Ok(None);
        }
        self.bytes.advance(LENGTH_PREFIX);
        Ok(Some(self.bytes.split_to(length).freeze()))
    }

    /// Reads what `socket` has without blocking, up to [`READ_BUDGET`],
    /// through this thread's chunk (zeroed once, not at every read: a
    /// small frame's read costs no 64 KiB of zeroing).
    pub(crate) fn read_some(&mut self, socket: &StdUnixStream) -> std::io::Result<Reading> {
        thread_local! {
            static CHUNK: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
        }
        CHUNK.with_borrow_mut(|chunk| {
            let mut read = 0;
            while read < READ_BUDGET {
                match (&*socket).read(chunk) {
                    Ok(0) => return Ok(Reading::Ended),
                    Ok(count) => {
                        self.extend(&chunk[..count]);
                        read += count;
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return Ok(Reading::Drained),
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(Reading::More)
        })
    }
}

/// What a read of a nonblocking socket found.
pub(crate) enum Reading {
    /// It would block now: everything that had arrived was read.
    Drained,
    /// The budget was read; more may be there.
    More,
    /// The peer closed it.
    Ended,
}

/// Where a reader's bytes come from.
pub(super) enum ReadSide {
    /// TCP or TLS, through the runtime.
    Async(Box<dyn AsyncRead + Send + Unpin>),
    /// Either end of a same-node Unix socket, nonblocking: watched by the
    /// runtime once awaited (a worker's end), or handed to the same-node
    /// reader thread (a caller's, see [`FrameReader::deliver`]).
    Local(LocalSocket),
}

/// A same-node socket's reading side: the stream that the reader thread
/// and waiting threads share, and the runtime's watch once awaited.
pub(super) struct LocalSocket {
    pub(super) stream: Arc<LocalStream>,
    watched: Option<AsyncFd<StdUnixStream>>,
}

impl LocalSocket {
    pub(super) fn new(stream: Arc<LocalStream>) -> Self {
        LocalSocket { stream, watched: None }
    }

    fn watched(&mut self) -> std::io::Result<&AsyncFd<StdUnixStream>> {
        if self.watched.is_none() {
            let socket = self.stream.socket.try_clone()?;
            // SAFETY: a UnixStream owns its descriptor and gives the same
            // one while the AsyncFd holds it.
            self.watched = Some(unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE)? });
        }
        Ok(self.watched.as_ref().expect("set above"))
    }
}

/// Reads frames of `M` from a stream.
pub struct FrameReader<M> {
    pub(super) socket: ReadSide,
    pub(super) frames: FrameBuffer,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message + Default> FrameReader<M> {
    pub(super) fn new(socket: ReadSide, frames: FrameBuffer) -> Self {
        FrameReader {
            socket,
            frames,
            _message: PhantomData,
        }
    }

    /// The next message; `None` once the peer closed the stream between
    /// frames. Cancel-safe: bytes read stay for the next call.
    pub async fn message(&mut self) -> Result<Option<M>> {
        self.next_as().await
    }

    pub(super) async fn next_as<T: Message + Default>(&mut self) -> Result<Option<T>> {
        loop {
            if let Some(message) = self.frames.next_message()? {
                return Ok(Some(message));
            }
            if self.frames.peer_closed {
                return self.frames.ended();
            }
            match &mut self.socket {
                ReadSide::Async(socket) => return self.frames.read_message(socket).await,
                // The last read may bring whole frames with the end: they
                // are taken before the end is.
                ReadSide::Local(socket) => {
                    self.frames.peer_closed = !read_local(socket.watched()?, &mut self.frames).await?
                }
            }
        }
    }
}

/// Reads once a same-node socket has bytes; `false` once it ended.
async fn read_local(socket: &AsyncFd<StdUnixStream>, frames: &mut FrameBuffer) -> std::io::Result<bool> {
    loop {
        let mut ready = socket.readable().await?;
        let before = frames.bytes.len();
        match frames.read_some(socket.get_ref())? {
            Reading::Ended => return Ok(false),
            Reading::More => return Ok(true),
            Reading::Drained => ready.clear_ready(),
        }
        if frames.bytes.len() > before {
            super::spin::frame_arrived();
            return Ok(true);
        }
    }
}
