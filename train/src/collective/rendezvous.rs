//! How the ranks of a group find each other: each binds a listener on the
//! IP its process serves on and puts the address in the cluster's
//! key-value store; then it connects to every lower rank and accepts every
//! higher one. Each connection opens with a hello naming the group, its
//! size and the rank, so a stale address of an earlier group is refused.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use raylet::Cluster;
use raylet_common::Backoff;

use super::CollectiveError;

const HELLO: &[u8; 8] = b"rlcoll01";
/// How often a missing address or a refused connection is tried again at
/// first (and how often a listener looks for ranks that connect).
const RETRY: Duration = Duration::from_millis(5);
/// How often they are tried again at most, once the rank waited a while.
const MAX_RETRY: Duration = Duration::from_millis(100);

/// Who a group's member is.
pub(crate) struct Member<'a> {
    pub(crate) name: &'a str,
    pub(crate) rank: usize,
    pub(crate) world: usize,
}

impl Member<'_> {
    fn key(&self, rank: usize) -> String {
        format!("raylet-train/collective/{}/{rank}", self.name)
    }

    fn hello(&self) -> Vec<u8> {
        let mut hello = HELLO.to_vec();
        hello.extend((self.world as u32).to_le_bytes());
        hello.extend((self.rank as u32).to_le_bytes());
        hello.extend((self.name.len() as u32).to_le_bytes());
        hello.extend(self.name.as_bytes());
        hello
    }

    /// The rank a peer's hello names, when it is of this group.
    fn read_hello(&self, stream: &mut TcpStream) -> Option<usize> {
        let mut fixed = [0u8; 20];
        stream.read_exact(&mut fixed).ok()?;
        let word = |at: usize| u32::from_le_bytes(fixed[at..at + 4].try_into().expect("4 bytes")) as usize;
        let (world, rank, name_len) = (word(8), word(12), word(16));
        if &fixed[..8] != HELLO || world != self.world || name_len != self.name.len() {
            return None;
        }
        let mut name = vec![0u8; name_len];
        stream.read_exact(&mut name).ok()?;
        (name == self.name.as_bytes() && rank < world).then_some(rank)
    }
}

/// Connects `member` to every other rank of its group within `timeout`;
/// returns one stream per rank, `None` at its own.
pub(crate) fn connect_ranks(
    cluster: &Cluster,
    member: &Member<'_>,
    timeout: Duration,
) -> Result<Vec<Option<TcpStream>>, CollectiveError> {
    let deadline = Instant::now() + timeout;
    let failed = |what: String| CollectiveError::Rendezvous(what);
    let listener = TcpListener::bind(SocketAddr::new(cluster.node_ip(), 0))
        .map_err(|e| failed(format!("binding a listener: {e}")))?;
    let address = listener.local_addr().map_err(|e| failed(e.to_string()))?;
    cluster
        .kv_put(member.key(member.rank), address.to_string())
        .map_err(|e| failed(format!("publishing this rank's address: {e}")))?;
    let mut streams: Vec<Option<TcpStream>> = (0..member.world).map(|_| None).collect();
    for (lower, stream) in streams.iter_mut().enumerate().take(member.rank) {
        *stream = Some(connect_to(cluster, member, lower, deadline)?);
    }
    accept_higher(&listener, member, &mut streams, deadline)?;
    let _ = cluster.kv_delete(member.key(member.rank));
    Ok(streams)
}

/// Connects to rank `lower` once its address is published.
fn connect_to(
    cluster: &Cluster,
    member: &Member<'_>,
    lower: usize,
    deadline: Instant,
) -> Result<TcpStream, CollectiveError> {
    let mut last = String::from("its address was never published");
    let mut backoff = Backoff::new(RETRY, MAX_RETRY);
    while Instant::now() < deadline {
        let published = cluster
            .kv_get(member.key(lower))
            .map_err(|e| CollectiveError::Rendezvous(format!("reading the address of rank {lower}: {e}")))?;
        let address = published.and_then(|bytes| String::from_utf8(bytes).ok()?.parse::<SocketAddr>().ok());
        if let Some(address) = address {
            let patience = deadline.saturating_duration_since(Instant::now()).max(RETRY);
            match TcpStream::connect_timeout(&address, patience) {
                Ok(mut stream) => match stream.write_all(&member.hello()) {
                    Ok(()) => return Ok(stream),
                    Err(error) => last = format!("saying hello to {address}: {error}"),
                },
                Err(error) => last = format!("connecting to {address}: {error}"),
            }
        }
        std::thread::sleep(backoff.next_delay());
    }
    Err(CollectiveError::Rendezvous(format!(
        "rank {lower} of group '{}' did not join in time ({last})",
        member.name
    )))
}

/// Accepts every higher rank of the group; connections that are not are dropped.
fn accept_higher(
    listener: &TcpListener,
    member: &Member<'_>,
    streams: &mut [Option<TcpStream>],
    deadline: Instant,
) -> Result<(), CollectiveError> {
    let failed = |what: String| CollectiveError::Rendezvous(what);
    listener.set_nonblocking(true).map_err(|e| failed(e.to_string()))?;
    let missing = |streams: &[Option<TcpStream>]| {
        (member.rank + 1..member.world)
            .filter(|&r| streams[r].is_none())
            .collect::<Vec<_>>()
    };
    while !missing(streams).is_empty() {
        if Instant::now() >= deadline {
            return Err(failed(format!(
                "ranks {:?} of group '{}' did not join in time",
                missing(streams),
                member.name
            )));
        }
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(RETRY);
                continue;
            }
            Err(error) => return Err(failed(format!("accepting a rank: {error}"))),
        };
        let patience = deadline.saturating_duration_since(Instant::now()).max(RETRY);
        let ready = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(patience)));
        if ready.is_err() {
            continue;
        }
        match member.read_hello(&mut stream) {
            Some(rank) if rank > member.rank && streams[rank].is_none() => streams[rank] = Some(stream),
            _ => tracing::debug!(group = member.name, "dropped a connection that is not of this group"),
        }
    }
    Ok(())
}
