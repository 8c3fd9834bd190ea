//! Objects a caller lends with a task: the finished values of its own
//! objects that references inside the task's arguments name, so that the
//! worker's gets of them are answered in its own process instead of by a
//! call back to the caller, up to a budget per task. Only inline values
//! (and failures) are lent: a stored value's location may go stale when
//! the owner rebuilds it elsewhere, so its readers keep asking the owner.

use prost::Message;
use raylet_proto::ObjectId;
use raylet_proto::v1::LentObject;

use crate::objects::owner::Owner;
use crate::submitter::task::Arg;
use crate::value::{Body, Outcome, outcome_from_proto, outcome_to_proto};

/// Encoded bytes lent with one task at most; the objects past it are
/// fetched from the caller as before. 10,000 small integers take about
/// 0.12 MiB of it.
const LENT_BYTES_PER_TASK: usize = 1 << 20;

/// The finished objects of `owner`'s that the arguments' values refer to.
pub(crate) fn lend_contained(owner: &Owner, args: &[Arg]) -> Vec<LentObject> {
    let contained = args.iter().flat_map(|arg| match arg {
        Arg::Value { contained, .. } => contained.as_slice(),
        Arg::Ref(_) => &[],
    });
    let finished = contained
        .filter(|object| owner.owns(object))
        .filter_map(|object| Some((object.id(), owner.store.try_get(object.id()).ok()??)));
    lendable(finished)
}

/// The outcomes that may be lent, in order, each once, within
/// [`LENT_BYTES_PER_TASK`].
fn lendable(finished: impl Iterator<Item = (ObjectId, Outcome)>) -> Vec<LentObject> {
    let mut lent = Vec::new();
    let mut seen = raylet_proto::IdSet::default();
    let mut budget = LENT_BYTES_PER_TASK;
    for (id, outcome) in finished {
        let stored = matches!(&outcome, Ok(value) if matches!(value.body, Body::Stored(_)));
        if stored || !seen.insert(id) {
            continue;
        }
        let outcome = outcome_to_proto(&outcome, false);
        let cost = outcome.encoded_len();
        if cost > budget {
            continue;
        }
        budget -= cost;
        lent.push(LentObject {
            object_id: id.as_bytes().to_vec(),
            outcome: Some(outcome),
        });
    }
    lent
}

/// The lent objects of a task as a worker keeps them; malformed ones are
/// left out, to be fetched from their owner.
pub(crate) fn received(lent: Vec<LentObject>) -> Vec<(ObjectId, Outcome)> {
    lent.into_iter()
        .filter_map(|object| {
            let id = ObjectId::from_wire(&object.object_id).ok()?;
            Some((id, outcome_from_proto(object.outcome?).0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_error::{TaskError, TaskErrorKind};
    use crate::value::{EncodedValue, Format, StoredAt};

    fn inline(bytes: usize) -> Outcome {
        Ok(EncodedValue::new::<Vec<u8>>(
            Format::Postcard,
            Body::Inline(vec![7; bytes].into()),
            Vec::new(),
        ))
    }

    fn ids(lent: &[LentObject]) -> Vec<ObjectId> {
        lent.iter()
            .map(|o| ObjectId::from_wire(&o.object_id).unwrap())
            .collect()
    }

    #[test]
    fn inline_values_and_failures_are_lent_once_each_and_stored_values_not() {
        let (a, b, c) = (ObjectId::random(), ObjectId::random(), ObjectId::random());
        let stored = Ok(EncodedValue::new::<Vec<u8>>(
            Format::Postcard,
            Body::Stored(StoredAt::new("127.0.0.1:1", 1 << 20)),
            Vec::new(),
        ));
        let failed = Err(TaskError::new(TaskErrorKind::Application, "f", "boom"));
        let lent = lendable([(a, inline(8)), (b, stored), (a, inline(8)), (c, failed)].into_iter());
        assert_eq!(ids(&lent), vec![a, c]);
        let received = received(lent);
        assert!(matches!(&received[1].1, Err(error) if error.message == "boom"));
    }

    #[test]
    fn ten_thousand_small_integers_are_all_lent_within_an_eighth_of_the_budget() {
        let values = (0..10_000u64).map(|i| (ObjectId::random(), Ok(EncodedValue::encode(&i).unwrap())));
        let lent = lendable(values);
        assert_eq!(lent.len(), 10_000);
        let bytes: usize = lent.iter().map(|o| o.outcome.as_ref().unwrap().encoded_len()).sum();
        assert!(bytes < LENT_BYTES_PER_TASK / 8, "{bytes} bytes");
    }

    #[test]
    fn values_past_the_budget_are_left_to_be_fetched() {
        let big = LENT_BYTES_PER_TASK / 3;
        let objects: Vec<ObjectId> = (0..4).map(|_| ObjectId::random()).collect();
        let small = ObjectId::random();
        let finished = objects.iter().map(|id| (*id, inline(big))).chain([(small, inline(8))]);
        let lent = lendable(finished);
        assert_eq!(ids(&lent), vec![objects[0], objects[1], small]);
    }
}
