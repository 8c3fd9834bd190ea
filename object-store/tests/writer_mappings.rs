//! A client keeps the segments it wrote mapped, writes a reused segment
//! through its old mapping, and unmaps each one the store stops keeping for
//! it, as `/proc/self/maps` shows.

mod common;

use std::time::{Duration, Instant};

use common::{MIB, Node, OWNER, WAIT, connect_client, fill, follows_pattern};
use raylet_common::auth::AuthToken;
use raylet_object_store::StoreClient;
use raylet_proto::ObjectId;

/// Writes an object of `size` bytes; returns its id and where this process
/// mapped it for writing.
async fn put(client: &StoreClient, size: u64, seed: u64) -> (ObjectId, usize) {
    let id = ObjectId::random();
    let mut writer = client.create(id, size, OWNER, WAIT).await.unwrap();
    fill(&mut writer, seed);
    let address = writer.as_ptr().addr();
    client.seal(writer, size).await.unwrap();
    (id, address)
}

/// How many mappings of this process show the memfd made for `first`,
/// the object that a segment was created for.
fn mappings_of_segment_made_for(first: ObjectId) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = format!("memfd:raylet-{first} ");
    maps.lines().filter(|line| line.contains(&name)).count()
}

async fn until_mapped_times(first: ObjectId, times: usize) {
    let deadline = Instant::now() + WAIT;
    while mappings_of_segment_made_for(first) != times {
        assert!(
            Instant::now() < deadline,
            "segment of {first} is still mapped {} times",
            mappings_of_segment_made_for(first)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the store has the release of a read of `id`, which travels
/// on the session stream and may arrive after a later delete; an object
/// deleted while read is freed rather than kept for reuse.
async fn until_released(node: &Node, id: ObjectId) {
    let deadline = Instant::now() + WAIT;
    let pinned = || {
        node.store
            .usage()
            .objects
            .iter()
            .any(|object| object.id == id && object.pins > 0)
    };
    while pinned() {
        assert!(Instant::now() < deadline, "the read of {id} is never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_reuses_its_mapping_and_unmaps_what_the_store_lets_go() {
    let token = AuthToken::generate();
    let node = Node::start(&token, 10 * MIB).await;
    let writer = &node.client;
    let other = connect_client(&node.address, &token).await;

    let (first, mapped_at) = put(writer, 2 * MIB, 1).await;
    assert_eq!(
        mappings_of_segment_made_for(first),
        1,
        "the writer keeps its mapping after the seal"
    );
    writer.delete(&[first]).await.unwrap();
    let (second, again_at) = put(writer, 2 * MIB, 2).await;
    assert_eq!(
        again_at, mapped_at,
        "a reused segment is written through the writer's mapping"
    );
    assert!(follows_pattern(&writer.get(second).await.unwrap(), 2));

    until_released(&node, second).await;
    writer.delete(&[second]).await.unwrap();
    let (third, _) = put(&other, 2 * MIB, 3).await;
    until_mapped_times(first, 1).await;
    assert!(follows_pattern(&other.get(third).await.unwrap(), 3));

    until_released(&node, third).await;
    other.delete(&[third]).await.unwrap();
    for seed in 0..3 {
        put(&other, 3 * MIB, seed).await;
    }
    until_mapped_times(first, 0).await;
}
