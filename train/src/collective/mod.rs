//! A collective group: the `world` ranks of a training job (each a worker,
//! usually an actor) meet through the cluster's key-value store, then
//! exchange buffers over direct TCP, as NCCL and Gloo groups do.
//!
//! - Large reductions use a chunked ring, reduce-scatter then allgather:
//!   each rank sends and receives 2(n-1)/n of the buffer whatever n is, and
//!   reduces chunks as they arrive.
//! - Small ones, where latency rules, send each buffer to every rank at
//!   once and reduce in rank order.
//! - Many small buffers (a model's gradients) are fused into few large
//!   ones, as Horovod does ([`CollectiveGroup::allreduce_fused`]).
//!
//! Tensors on any device (a GPU's included; feature `burn`) take part through
//! [`CollectiveGroup::allreduce_tensor`] and
//! [`CollectiveGroup::broadcast_tensor`], staged through host memory: there
//! is no NCCL path.
//!
//! Ranks on the same host move their bytes through shared-memory pipes
//! instead of TCP (as NCCL's and Open MPI's shared-memory transports do),
//! unless [`GroupOptions::shared_memory`] is off.
//!
//! Every rank gets bit-identical results. A rank whose call fails (a peer
//! died, or did not answer within the timeout) closes its links, so the
//! other ranks fail at once too instead of waiting; the group is then
//! broken, and a new one (under a new name) must be made.

mod algorithms;
mod element;
mod rendezvous;
mod shared_memory;
#[cfg(feature = "burn")]
mod tensors;
mod wire;

use std::ops::Range;
use std::time::Duration;

use raylet::Cluster;

pub use algorithms::{even_segments, segment_range};
pub use element::{Element, ReduceOp};

use algorithms::Call;
use element::finish;
use rendezvous::{Member, connect_ranks};
use wire::Links;

/// Why a collective call failed.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error("the collective group could not form: {0}")]
    Rendezvous(String),
    #[error("rank {peer} is gone: {reason}")]
    PeerLost { peer: usize, reason: String },
    #[error("rank {peer} did not answer within the group's timeout")]
    Timeout { peer: usize },
    #[error(
        "rank {peer} is at collective call {got} and this rank at {expected}: the ranks did not call the same collectives"
    )]
    OutOfStep { peer: usize, expected: u64, got: u64 },
    #[error("rank {peer} sent {got} bytes where {expected} were expected: the ranks passed buffers of different sizes")]
    SizeMismatch { peer: usize, expected: usize, got: usize },
    #[error("the group is broken since an earlier call failed ({0}); make a new group")]
    Broken(String),
    #[error("{0}")]
    InvalidArgument(String),
}

impl CollectiveError {
    pub(crate) fn from_io(peer: usize, error: std::io::Error) -> Self {
        match error.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => CollectiveError::Timeout { peer },
            _ => CollectiveError::PeerLost {
                peer,
                reason: error.to_string(),
            },
        }
    }
}

/// How a group behaves.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// How long a call waits for a peer before it fails.
    pub timeout: Duration,
    /// How long joining waits for every rank.
    pub rendezvous_timeout: Duration,
    /// Reductions of up to this many bytes go to every rank at once
    /// instead of around the ring.
    pub small_bytes: usize,
    /// Bytes a ring step reads and reduces at a time.
    pub chunk_bytes: usize,
    /// [`CollectiveGroup::allreduce_fused`] packs buffers into one of up to
    /// this many bytes.
    pub fusion_bytes: usize,
    /// Ranks on the same host exchange through shared memory (TCP then only
    /// watches that the peer lives); off, every byte goes over TCP.
    pub shared_memory: bool,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            timeout: Duration::from_secs(60),
            rendezvous_timeout: Duration::from_secs(60),
            small_bytes: 64 << 10,
            chunk_bytes: 1 << 20,
            fusion_bytes: 64 << 20,
            shared_memory: true,
        }
    }
}

/// One rank's membership of a collective group.
pub struct CollectiveGroup {
    rank: usize,
    world: usize,
    links: Links,
    options: GroupOptions,
    /// Counts this rank's calls; every message carries it.
    seq: u64,
    broken: Option<String>,
}

impl CollectiveGroup {
    /// Joins group `name` as `rank` of `world` ranks, once all of them have.
    /// The name must be new for every group (add an attempt number when a
    /// group is made again).
    pub fn join(
        cluster: &Cluster,
        name: &str,
        rank: usize,
        world: usize,
        options: GroupOptions,
    ) -> Result<Self, CollectiveError> {
        if world == 0 || rank >= world {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {rank} is not in a group of {world} ranks"
            )));
        }
        let member = Member { name, rank, world };
        let streams = connect_ranks(cluster, &member, options.rendezvous_timeout)?;
        let links = Links::new(streams, options.timeout, options.shared_memory)?;
        Ok(CollectiveGroup {
            rank,
            world,
            links,
            options,
            seq: 0,
            broken: None,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// How many of this rank's links to other ranks go through shared
    /// memory (the others are TCP).
    pub fn shared_memory_links(&self) -> usize {
        self.links.shared_memory_links()
    }

    /// Reduces `values` over every rank, in place; every rank passes as many.
    pub fn allreduce<T: Element>(&mut self, values: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        let bytes = std::mem::size_of_val(values);
        let (world, small) = (self.world, bytes <= self.options.small_bytes);
        let algorithm = match (world, small) {
            (1, _) => "local",
            (_, true) => "mesh",
            (_, false) => "ring",
        };
        let started = std::time::Instant::now();
        let _span = raylet::timeline::span("allreduce", "train.allreduce")
            .arg("bytes", bytes)
            .arg("algorithm", algorithm);
        let done = self.call::<T, _>(|call| {
            match (world, small) {
                (1, _) => {}
                (_, true) => call.mesh_allreduce(values, op)?,
                (_, false) => {
                    let segments = even_segments(values.len(), world);
                    {
                        let _phase = raylet::timeline::span("reduce_scatter", "train.allreduce");
                        call.ring_reduce_scatter(values, &segments, op)?;
                    }
                    finish(&mut values[segments[call.rank].clone()], op, world);
                    let _phase = raylet::timeline::span("allgather", "train.allreduce");
                    return call.ring_allgather(values, &segments);
                }
            }
            finish(values, op, world);
            Ok(())
        });
        crate::telemetry::allreduce(algorithm, started.elapsed());
        done
    }

    /// Reduces many buffers over every rank, in place, packed into as few
    /// fusion buffers of up to [`GroupOptions::fusion_bytes`] as they fit in.
    pub fn allreduce_fused<T: Element>(
        &mut self,
        buffers: &mut [&mut [T]],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let limit = (self.options.fusion_bytes / std::mem::size_of::<T>()).max(1);
        let mut start = 0;
        while start < buffers.len() {
            let mut end = start + 1;
            let mut packed = buffers[start].len();
            while end < buffers.len() && packed + buffers[end].len() <= limit {
                packed += buffers[end].len();
                end += 1;
            }
            let group = &mut buffers[start..end];
            if group.len() == 1 {
                self.allreduce(group[0], op)?;
            } else {
                let mut fused: Vec<T> = group.iter().flat_map(|buffer| buffer.iter().copied()).collect();
                self.allreduce(&mut fused, op)?;
                let mut offset = 0;
                for buffer in group.iter_mut() {
                    buffer.copy_from_slice(&fused[offset..offset + buffer.len()]);
                    offset += buffer.len();
                }
            }
            start = end;
        }
        Ok(())
    }

    /// Copies rank `root`'s `values` to every rank; every rank passes as many.
    pub fn broadcast<T: Element>(&mut self, values: &mut [T], root: usize) -> Result<(), CollectiveError> {
        self.check_root(root)?;
        self.call::<T, _>(|call| call.broadcast(values, root))
    }

    /// Copies rank `root`'s bytes (a model's record, say) to every rank;
    /// the others' are replaced, whatever their length.
    pub fn broadcast_bytes(&mut self, bytes: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError> {
        self.check_root(root)?;
        self.call::<f32, _>(|call| call.broadcast_bytes(bytes, root))
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        let mut token = [0f32];
        self.call::<f32, _>(|call| call.mesh_allreduce(&mut token, ReduceOp::Sum))
    }

    /// Every rank's `part`, in rank order; every rank passes as many elements.
    pub fn allgather<T: Element>(&mut self, part: &[T]) -> Result<Vec<T>, CollectiveError> {
        let mut gathered = vec![T::zeroed(); part.len() * self.world];
        gathered[self.rank * part.len()..(self.rank + 1) * part.len()].copy_from_slice(part);
        let segments: Vec<Range<usize>> = (0..self.world).map(|r| r * part.len()..(r + 1) * part.len()).collect();
        self.call::<T, _>(|call| call.ring_allgather(&mut gathered, &segments))?;
        Ok(gathered)
    }

    /// Fills `values` with every rank's segment, in place: on the way in,
    /// this rank's `segments[rank]` holds its part (`segments` has one range
    /// per rank, in order, covering `values`; the same on every rank).
    pub fn allgather_segments<T: Element>(
        &mut self,
        values: &mut [T],
        segments: &[Range<usize>],
    ) -> Result<(), CollectiveError> {
        self.check_segments(values.len(), segments)?;
        let _span = raylet::timeline::span("allgather", "train.allreduce").arg("bytes", std::mem::size_of_val(values));
        self.call::<T, _>(|call| call.ring_allgather(values, segments))
    }

    /// Reduces `values` over every rank and returns this rank's segment of
    /// the result: [`segment_range`]`(values.len(), world, rank)`.
    pub fn reduce_scatter<T: Element>(&mut self, values: &[T], op: ReduceOp) -> Result<Vec<T>, CollectiveError> {
        let mut reduced = values.to_vec();
        let segments = even_segments(values.len(), self.world);
        self.reduce_scatter_segments(&mut reduced, &segments, op)?;
        Ok(reduced[segments[self.rank].clone()].to_vec())
    }

    /// Reduces `values` over every rank in place, leaving the result in this
    /// rank's `segments[rank]` only (the rest of `values` is scratch
    /// afterwards); `segments` as for [`CollectiveGroup::allgather_segments`].
    pub fn reduce_scatter_segments<T: Element>(
        &mut self,
        values: &mut [T],
        segments: &[Range<usize>],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.check_segments(values.len(), segments)?;
        let _span =
            raylet::timeline::span("reduce_scatter", "train.allreduce").arg("bytes", std::mem::size_of_val(values));
        let world = self.world;
        self.call::<T, _>(|call| call.ring_reduce_scatter(values, segments, op))?;
        finish(&mut values[segments[self.rank].clone()], op, world);
        Ok(())
    }

    /// Every rank's `bytes` at rank `root`, by rank; an empty list elsewhere.
    pub fn gather_bytes(&mut self, bytes: Vec<u8>, root: usize) -> Result<Vec<Vec<u8>>, CollectiveError> {
        self.check_root(root)?;
        self.call::<f32, _>(|call| call.gather_bytes(bytes, root))
    }

    fn check_segments(&self, len: usize, segments: &[Range<usize>]) -> Result<(), CollectiveError> {
        let contiguous = segments.windows(2).all(|pair| pair[0].end == pair[1].start);
        let covers = segments.first().is_some_and(|s| s.start == 0) && segments.last().is_some_and(|s| s.end == len);
        match segments.len() == self.world && contiguous && covers {
            true => Ok(()),
            false => Err(CollectiveError::InvalidArgument(format!(
                "segments must be {} contiguous ranges covering the {len} elements, in rank order",
                self.world
            ))),
        }
    }

    fn check_root(&self, root: usize) -> Result<(), CollectiveError> {
        match root < self.world {
            true => Ok(()),
            false => Err(CollectiveError::InvalidArgument(format!(
                "root {root} is not a rank of a group of {}",
                self.world
            ))),
        }
    }

    /// Runs one collective call; a failure breaks the group and closes its
    /// links, so that the other ranks fail too.
    fn call<T: Element, R>(
        &mut self,
        run: impl FnOnce(&mut Call<'_>) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        if let Some(cause) = &self.broken {
            return Err(CollectiveError::Broken(cause.clone()));
        }
        self.seq += 1;
        let mut call = Call {
            links: &mut self.links,
            rank: self.rank,
            world: self.world,
            seq: self.seq,
            chunk_elements: (self.options.chunk_bytes / std::mem::size_of::<T>()).max(1),
        };
        let result = run(&mut call);
        if let Err(error) = &result {
            tracing::warn!(rank = self.rank, %error, "a collective call failed; the group is broken");
            self.broken = Some(error.to_string());
            self.links.shut_down();
        }
        result
    }
}

impl Drop for CollectiveGroup {
    fn drop(&mut self) {
        self.links.shut_down();
    }
}
