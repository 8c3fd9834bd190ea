//! The algorithms of the collective calls, over a group's links. The ring
//! ones move a buffer split in one segment per rank: each step sends one
//! segment to the right-hand rank while the left-hand one's arrives, in
//! chunks that are reduced as they come. The mesh ones send a whole small
//! buffer to every rank at once.

use std::ops::Range;

use bytemuck::{cast_slice, cast_slice_mut};

use super::CollectiveError;
use super::element::{Element, ReduceOp, combine};
use super::wire::{Links, Reader};

/// Where segment `index` of a buffer of `len` elements split over `world`
/// ranks lies: the first `len % world` segments have one element more.
pub fn segment_range(len: usize, world: usize, index: usize) -> Range<usize> {
    let (base, extra) = (len / world, len % world);
    let start = index * base + index.min(extra);
    start..start + base + usize::from(index < extra)
}

/// Every rank's segment of a buffer of `len` elements: [`segment_range`]
/// of each rank in turn.
pub fn even_segments(len: usize, world: usize) -> Vec<Range<usize>> {
    (0..world).map(|index| segment_range(len, world, index)).collect()
}

/// One call's place in the group: its links, where this rank is, and the
/// call's sequence number.
pub(crate) struct Call<'a> {
    pub(crate) links: &'a mut Links,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) seq: u64,
    /// Elements reduced per read of a ring step.
    pub(crate) chunk_elements: usize,
}

impl Call<'_> {
    fn right(&self) -> usize {
        (self.rank + 1) % self.world
    }

    fn left(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    /// The segment `back` places behind this rank's, around the ring.
    fn segment_behind(&self, back: usize) -> usize {
        (self.rank + 2 * self.world - back) % self.world
    }

    /// Ring reduce-scatter over `segments` (one per rank, in order, covering
    /// `values`): afterwards this rank holds segment `rank` reduced over
    /// every rank (not yet divided for a mean).
    pub(crate) fn ring_reduce_scatter<T: Element>(
        &mut self,
        values: &mut [T],
        segments: &[Range<usize>],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let chunk = self.chunk_elements.max(1);
        for step in 0..self.world - 1 {
            let out = segments[self.segment_behind(step + 1)].clone();
            let into = segments[self.segment_behind(step + 2)].clone();
            let (out, into) = two_segments(values, out, into);
            self.exchange(cast_slice(out), |reader, seq| {
                let announced = reader.header(seq)?;
                reader.expect_len(announced, std::mem::size_of_val(into))?;
                reader.reduce_into(into, op, chunk)
            })?;
        }
        Ok(())
    }

    /// Ring allgather over `segments` (one per rank, in order, covering
    /// `values`): each rank starts with segment `rank` and ends with all.
    pub(crate) fn ring_allgather<T: Element>(
        &mut self,
        values: &mut [T],
        segments: &[Range<usize>],
    ) -> Result<(), CollectiveError> {
        for step in 0..self.world - 1 {
            let out = segments[self.segment_behind(step)].clone();
            let into = segments[self.segment_behind(step + 1)].clone();
            let (out, into) = two_segments(values, out, into);
            self.exchange(cast_slice(out), |reader, seq| {
                reader.recv_exact(seq, cast_slice_mut(into))
            })?;
        }
        Ok(())
    }

    /// Sends `out` to the right-hand rank while `receive` reads from the
    /// left-hand one (first one, then the other, when the link takes `out`
    /// without waiting for the peer). When either fails, both links are
    /// closed, so the other side does not wait out its timeout.
    fn exchange(
        &mut self,
        out: &[u8],
        receive: impl FnOnce(&mut Reader, u64) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let (left, right, seq, world) = (self.left(), self.right(), self.seq, self.world);
        let stopper = self.links.stopper(right)?;
        let Links { readers, writers } = &mut *self.links;
        let writer = writers[right].as_mut().expect("a ring neighbour is another rank");
        let reader = readers[left].as_mut().expect("a ring neighbour is another rank");
        if writer.sends_without_waiting(out.len(), world) {
            writer.send(seq, out)?;
            return receive(reader, seq);
        }
        std::thread::scope(|scope| {
            let sending = scope.spawn(move || writer.send(seq, out));
            let received = receive(reader, seq);
            if received.is_err() {
                stopper.stop();
            }
            let sent = sending
                .join()
                .unwrap_or_else(|_| Err(CollectiveError::Broken("a sender panicked".into())));
            received.and(sent)
        })
    }

    /// Sends `payload` to every other rank and returns what each sent, by rank
    /// (this rank's own entry empty).
    pub(crate) fn mesh_exchange(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let (rank, world, seq) = (self.rank, self.world, self.seq);
        let peers: Vec<usize> = (0..world).filter(|&peer| peer != rank).collect();
        let Links { readers, writers } = &mut *self.links;
        let inline = peers.iter().all(|&peer| {
            writers[peer]
                .as_ref()
                .expect("another rank")
                .sends_without_waiting(payload.len(), world)
        });
        let mut send_all = || {
            peers
                .iter()
                .try_for_each(|&peer| writers[peer].as_mut().expect("another rank").send(seq, payload))
        };
        let mut receive_all = || {
            let mut received = vec![Vec::new(); world];
            for &peer in &peers {
                received[peer] = readers[peer].as_mut().expect("another rank").recv_vec(seq)?;
            }
            Ok(received)
        };
        if inline {
            send_all()?;
            return receive_all();
        }
        std::thread::scope(|scope| {
            let sending = scope.spawn(send_all);
            let received = receive_all();
            let sent = sending
                .join()
                .unwrap_or_else(|_| Err(CollectiveError::Broken("a sender panicked".into())));
            let received = received?;
            sent.map(|()| received)
        })
    }

    /// Every rank's `values` reduced in rank order, so that every rank gets
    /// the very same bits.
    pub(crate) fn mesh_allreduce<T: Element>(&mut self, values: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        let received = self.mesh_exchange(cast_slice(values))?;
        let own: Vec<T> = values.to_vec();
        for (peer, bytes) in received.iter().enumerate() {
            let contribution: &[T] = match peer == self.rank {
                true => &own,
                false => {
                    let expected = std::mem::size_of_val(values);
                    if bytes.len() != expected {
                        return Err(CollectiveError::SizeMismatch {
                            peer,
                            expected,
                            got: bytes.len(),
                        });
                    }
                    bytemuck::try_cast_slice(bytes).map_err(|_| CollectiveError::Broken("misaligned payload".into()))?
                }
            };
            match peer {
                0 => values.copy_from_slice(contribution),
                _ => combine(values, contribution, op),
            }
        }
        Ok(())
    }

    /// Every rank's `payload` at `root`, by rank (empty elsewhere).
    pub(crate) fn gather_bytes(&mut self, payload: Vec<u8>, root: usize) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let seq = self.seq;
        if self.rank != root {
            self.links.writer(root).send(seq, &payload)?;
            return Ok(Vec::new());
        }
        let mut gathered = vec![Vec::new(); self.world];
        for peer in (0..self.world).filter(|&peer| peer != root) {
            gathered[peer] = self.links.reader(peer).recv_vec(seq)?;
        }
        gathered[root] = payload;
        Ok(gathered)
    }

    /// The root's `payload` on every rank.
    pub(crate) fn broadcast_bytes(&mut self, payload: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError> {
        let seq = self.seq;
        if self.rank == root {
            for peer in (0..self.world).filter(|&peer| peer != root) {
                self.links.writer(peer).send(seq, payload)?;
            }
            return Ok(());
        }
        *payload = self.links.reader(root).recv_vec(seq)?;
        Ok(())
    }

    /// The root's `values` on every rank; every rank passes as many.
    pub(crate) fn broadcast<T: Element>(&mut self, values: &mut [T], root: usize) -> Result<(), CollectiveError> {
        let seq = self.seq;
        if self.rank == root {
            for peer in (0..self.world).filter(|&peer| peer != root) {
                self.links.writer(peer).send(seq, cast_slice(values))?;
            }
            return Ok(());
        }
        self.links.reader(root).recv_exact(seq, cast_slice_mut(values))
    }
}

/// Two distinct segments of `values`: one to read, one to write.
fn two_segments<T>(values: &mut [T], out: Range<usize>, into: Range<usize>) -> (&[T], &mut [T]) {
    if out.start < into.start {
        let (low, high) = values.split_at_mut(into.start);
        (&low[out], &mut high[..into.len()])
    } else {
        let (low, high) = values.split_at_mut(out.start);
        (&high[..out.len()], &mut low[into])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer_once_the_first_ones_longer() {
        for (len, world) in [(0, 3), (1, 4), (10, 3), (7, 7), (1_000_003, 4)] {
            let ranges: Vec<Range<usize>> = (0..world).map(|i| segment_range(len, world, i)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[world - 1].end, len);
            assert!(ranges.windows(2).all(|pair| pair[0].end == pair[1].start));
            let sizes: Vec<usize> = ranges.iter().map(|range| range.len()).collect();
            assert!(
                sizes
                    .windows(2)
                    .all(|pair| pair[0] >= pair[1] && pair[0] - pair[1] <= 1),
                "{sizes:?}"
            );
        }
    }

    #[test]
    fn two_segments_are_the_ones_asked_for_either_way_round() {
        let mut values: Vec<u32> = (0..10).collect();
        let (out, into) = two_segments(&mut values, 0..3, 6..10);
        assert_eq!(out, [0, 1, 2]);
        into[0] = 99;
        let (out, into) = two_segments(&mut values, 6..10, 3..6);
        assert_eq!(out, [99, 7, 8, 9]);
        assert_eq!(into, [3, 4, 5]);
    }
}
