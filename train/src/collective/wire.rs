//! The TCP links between the ranks of a group: one stream per peer, read
//! and written from different threads at once. Every message is framed
//! with the sequence number of the collective call it belongs to and its
//! length, so ranks that call different collectives fail instead of
//! mixing them up.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use super::CollectiveError;

/// Bytes of a frame header: sequence number and payload length.
const HEADER: usize = 16;

/// The read and write halves of the streams to every peer; `None` at this
/// rank's own index.
pub(crate) struct Links {
    pub(crate) readers: Vec<Option<Reader>>,
    pub(crate) writers: Vec<Option<Writer>>,
}

pub(crate) struct Reader {
    peer: usize,
    stream: TcpStream,
}

pub(crate) struct Writer {
    peer: usize,
    stream: TcpStream,
}

impl Links {
    /// Links over `streams` (one per peer, `None` at this rank), whose reads
    /// and writes give up after `timeout`.
    pub(crate) fn new(streams: Vec<Option<TcpStream>>, timeout: Duration) -> Result<Self, CollectiveError> {
        let mut readers = Vec::with_capacity(streams.len());
        let mut writers = Vec::with_capacity(streams.len());
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                readers.push(None);
                writers.push(None);
                continue;
            };
            let setup =
                |e: std::io::Error| CollectiveError::Rendezvous(format!("setting up the link to rank {peer}: {e}"));
            stream.set_nodelay(true).map_err(setup)?;
            stream.set_read_timeout(Some(timeout)).map_err(setup)?;
            stream.set_write_timeout(Some(timeout)).map_err(setup)?;
            let writer = stream.try_clone().map_err(setup)?;
            readers.push(Some(Reader { peer, stream }));
            writers.push(Some(Writer { peer, stream: writer }));
        }
        Ok(Links { readers, writers })
    }

    /// Closes every stream, so that peers blocked on this rank fail at once.
    pub(crate) fn shut_down(&self) {
        for reader in self.readers.iter().flatten() {
            let _ = reader.stream.shutdown(Shutdown::Both);
        }
    }

    /// A handle on the stream to `peer` that can close it while it is in use.
    pub(crate) fn stopper(&self, peer: usize) -> Result<TcpStream, CollectiveError> {
        let writer = self.writers[peer].as_ref().expect("a rank has no link to itself");
        writer.stream.try_clone().map_err(|e| CollectiveError::from_io(peer, e))
    }

    pub(crate) fn reader(&mut self, peer: usize) -> &mut Reader {
        self.readers[peer].as_mut().expect("a rank has no link to itself")
    }

    pub(crate) fn writer(&mut self, peer: usize) -> &mut Writer {
        self.writers[peer].as_mut().expect("a rank has no link to itself")
    }
}

impl Writer {
    /// Sends one message of collective call `seq`.
    pub(crate) fn send(&mut self, seq: u64, payload: &[u8]) -> Result<(), CollectiveError> {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&seq.to_le_bytes());
        header[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let peer = self.peer;
        self.stream
            .write_all(&header)
            .and_then(|()| self.stream.write_all(payload))
            .map_err(|e| CollectiveError::from_io(peer, e))
    }
}

impl Reader {
    /// Reads the header of the next message of call `seq`; returns its length.
    pub(crate) fn header(&mut self, seq: u64) -> Result<usize, CollectiveError> {
        let mut header = [0u8; HEADER];
        self.read(&mut header)?;
        let got = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        if got != seq {
            return Err(CollectiveError::OutOfStep {
                peer: self.peer,
                expected: seq,
                got,
            });
        }
        Ok(u64::from_le_bytes(header[8..].try_into().expect("8 bytes")) as usize)
    }

    /// Reads the next message of call `seq` into `into`, which it must fill.
    pub(crate) fn recv_exact(&mut self, seq: u64, into: &mut [u8]) -> Result<(), CollectiveError> {
        let len = self.header(seq)?;
        self.expect_len(len, into.len())?;
        self.read(into)
    }

    /// Reads the next message of call `seq`, whatever its length.
    pub(crate) fn recv_vec(&mut self, seq: u64) -> Result<Vec<u8>, CollectiveError> {
        let len = self.header(seq)?;
        let mut payload = vec![0u8; len];
        self.read(&mut payload)?;
        Ok(payload)
    }

    pub(crate) fn expect_len(&self, got: usize, expected: usize) -> Result<(), CollectiveError> {
        match got == expected {
            true => Ok(()),
            false => Err(CollectiveError::SizeMismatch {
                peer: self.peer,
                expected,
                got,
            }),
        }
    }

    /// Fills `into` from the stream.
    pub(crate) fn read(&mut self, into: &mut [u8]) -> Result<(), CollectiveError> {
        let peer = self.peer;
        self.stream
            .read_exact(into)
            .map_err(|e| CollectiveError::from_io(peer, e))
    }
}
