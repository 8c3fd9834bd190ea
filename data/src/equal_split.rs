//! How an equal streaming split (`Dataset::streaming_split_equal`) deals
//! its rows: each finished block, after the rows left over from the blocks
//! before it, is cut into one part per consumer, all of the same number of
//! rows; what does not divide evenly waits for the next block, and at an
//! epoch's end those rows (at most one fewer than the consumers) are
//! dropped, while the row errors that waited with them go to a consumer in
//! a part without rows. Every consumer so reads exactly as many rows as the others, and
//! a training loop that allreduces at every batch cannot wait on a shard
//! that ran dry (the hazard Ray's `equal=True` split guards against).

use crate::block_output::{BlockOutput, RowPayload};
use crate::block_rows::RowData;
use crate::rows_error::RowsError;
use crate::stage::RowError;

/// Cuts an epoch's blocks into equal parts, one per consumer.
pub(crate) struct EqualDealer {
    consumers: usize,
    /// Rows of the blocks dealt so far that no consumer has yet.
    leftover: Option<RowData>,
    /// Rows left out under `OnError::Skip` by blocks whose rows have not
    /// been dealt yet: they go with the next first part.
    skipped: Vec<RowError>,
    /// No rows, of the kind the epoch's blocks hold: the part that carries
    /// the last row errors at the epoch's end.
    empty: Option<RowData>,
}

impl EqualDealer {
    pub fn new(consumers: usize) -> Self {
        EqualDealer {
            consumers: consumers.max(1),
            leftover: None,
            skipped: Vec::new(),
            empty: None,
        }
    }

    /// One part per consumer, all of the same number of rows: the rows
    /// left over before, then `block`'s, as far as they divide evenly; no
    /// parts when there are fewer rows than consumers. The rows `block`
    /// left out under `OnError::Skip` go with the first part (or wait with
    /// the rows left over).
    pub fn deal(&mut self, block: BlockOutput) -> Result<Vec<BlockOutput>, RowsError> {
        let rows = block.rows.into_data()?;
        let rows = match self.leftover.take() {
            Some(leftover) => RowData::concat(vec![leftover, rows])?,
            None => rows,
        };
        if self.empty.is_none() {
            self.empty = Some(rows.select(&[])?);
        }
        let each = rows.len() / self.consumers;
        let dealt = each * self.consumers;
        if dealt < rows.len() {
            self.leftover = Some(rows.select(&indices(dealt, rows.len()))?);
        }
        self.skipped.extend(block.skipped);
        let mut skipped = match each {
            0 => Vec::new(),
            _ => std::mem::take(&mut self.skipped),
        };
        (0..self.consumers)
            .filter(|_| each > 0)
            .map(|consumer| {
                let part = rows.select(&indices(consumer * each, (consumer + 1) * each))?;
                Ok(BlockOutput {
                    rows: RowPayload::of(part)?,
                    count: each as u64,
                    skipped: std::mem::take(&mut skipped),
                    files: Vec::new(),
                    held: Vec::new(),
                })
            })
            .collect()
    }

    /// The rows no consumer got: those left over once the epoch's last
    /// block is dealt.
    pub fn undealt(&self) -> usize {
        self.leftover.as_ref().map_or(0, RowData::len)
    }

    /// Once the epoch's last block is dealt: a part without rows that
    /// carries the row errors of the blocks whose rows were never dealt
    /// (too few to go round), or none when there are none.
    pub fn finish(&mut self) -> Result<Option<BlockOutput>, RowsError> {
        if self.skipped.is_empty() {
            return Ok(None);
        }
        let Some(empty) = self.empty.take() else {
            return Ok(None);
        };
        Ok(Some(BlockOutput {
            rows: RowPayload::of(empty)?,
            count: 0,
            skipped: std::mem::take(&mut self.skipped),
            files: Vec::new(),
            held: Vec::new(),
        }))
    }
}

/// The row indices `start..end`, as `RowData::select` takes them.
fn indices(start: usize, end: usize) -> Vec<u32> {
    (start as u32..end as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoded_rows::EncodedRows;

    fn block(rows: std::ops::Range<u64>) -> BlockOutput {
        let rows: Vec<u64> = rows.collect();
        BlockOutput {
            count: rows.len() as u64,
            rows: RowPayload::Typed(EncodedRows::encode(&rows).unwrap()),
            skipped: Vec::new(),
            files: Vec::new(),
            held: Vec::new(),
        }
    }

    /// The error of a row left out because it did not parse.
    fn unparsed(source: &str) -> RowError {
        RowError {
            function: "parse".into(),
            source: source.into(),
            message: "not a number".into(),
        }
    }

    fn rows_of(parts: &[BlockOutput]) -> Vec<Vec<u64>> {
        parts.iter().map(|part| part.decode_rows::<u64>().unwrap()).collect()
    }

    #[test]
    fn every_consumer_gets_as_many_rows_and_the_rest_waits_for_the_next_block() {
        let mut dealer = EqualDealer::new(3);
        assert_eq!(
            rows_of(&dealer.deal(block(0..7)).unwrap()),
            [vec![0, 1], vec![2, 3], vec![4, 5]]
        );
        assert_eq!(dealer.undealt(), 1);
        assert_eq!(rows_of(&dealer.deal(block(7..9)).unwrap()), [vec![6], vec![7], vec![8]]);
        assert_eq!(dealer.undealt(), 0);
    }

    #[test]
    fn rows_left_out_by_a_block_too_small_to_deal_go_with_the_next_first_part() {
        let mut dealer = EqualDealer::new(3);
        let mut small = block(0..1);
        small.skipped.push(unparsed("item 7"));
        assert!(dealer.deal(small).unwrap().is_empty());
        let parts = dealer.deal(block(1..3)).unwrap();
        assert_eq!(parts[0].skipped.len(), 1, "the left-out row is kept");
        assert!(parts[1..].iter().all(|part| part.skipped.is_empty()));
    }

    #[test]
    fn row_errors_waiting_with_the_undealt_rows_at_the_epochs_end_go_in_a_part_without_rows() {
        let mut dealer = EqualDealer::new(3);
        assert_eq!(dealer.deal(block(0..3)).unwrap().len(), 3);
        assert!(dealer.finish().unwrap().is_none(), "no row error, no extra part");
        let mut small = block(3..4);
        small.skipped.push(unparsed("item 9"));
        assert!(dealer.deal(small).unwrap().is_empty());
        let last = dealer.finish().unwrap().expect("a part for the row error");
        assert_eq!((last.count, last.skipped.len()), (0, 1));
        assert!(rows_of(&[last])[0].is_empty());
        assert_eq!(dealer.undealt(), 1, "the undealt row itself is still dropped");
    }

    #[test]
    fn blocks_smaller_than_the_consumers_wait_until_there_are_enough_rows() {
        let mut dealer = EqualDealer::new(4);
        assert!(dealer.deal(block(0..2)).unwrap().is_empty());
        assert!(dealer.deal(block(2..3)).unwrap().is_empty());
        assert_eq!(
            rows_of(&dealer.deal(block(3..6)).unwrap()),
            [vec![0], vec![1], vec![2], vec![3]]
        );
        assert_eq!(dealer.undealt(), 2);
    }

    #[test]
    fn over_uneven_blocks_no_row_is_dealt_twice_and_fewer_than_the_consumers_are_dropped() {
        let consumers = 5;
        let mut dealer = EqualDealer::new(consumers);
        let mut got: Vec<Vec<u64>> = vec![Vec::new(); consumers];
        let mut next = 0;
        for size in [1, 13, 0, 7, 2, 40, 3] {
            for (consumer, rows) in rows_of(&dealer.deal(block(next..next + size)).unwrap())
                .into_iter()
                .enumerate()
            {
                got[consumer].extend(rows);
            }
            next += size;
        }
        assert!(got.iter().all(|rows| rows.len() == got[0].len()), "{got:?}");
        let mut all: Vec<u64> = got.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len() + dealer.undealt(), next as usize);
        assert!(dealer.undealt() < consumers);
    }
}
