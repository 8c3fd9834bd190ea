//! A store's same-node calls: creates, seals and gets made on the caller's
//! thread through the store's Unix socket, and what the store declines,
//! which the caller then makes over gRPC.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{MIB, Node, OWNER, WAIT, fill, follows_pattern};
use raylet_common::auth::AuthToken;
use raylet_object_store::{SameNodeStore, StoreClient};
use raylet_proto::ObjectId;
use raylet_proto::same_node_calls::CallServer;

/// A client of `node`'s store that makes what it can through the store's
/// same-node socket.
async fn same_node_client(node: &Node, token: &AuthToken) -> Arc<StoreClient> {
    let channel = raylet_proto::channel::connect(&node.address, token, WAIT)
        .await
        .unwrap();
    let same_node = SameNodeStore::new(&node.address, token.clone());
    StoreClient::connect(channel, OWNER, Some(same_node)).await.unwrap()
}

fn serve_same_node(node: &Node, token: &AuthToken) -> CallServer {
    let address = node.address.parse().unwrap();
    node.store
        .serve_same_node(address, token.clone())
        .expect("the socket is bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_created_sealed_and_got_on_the_callers_thread() {
    let token = AuthToken::generate();
    let node = Node::start(&token, 64 * MIB).await;
    let _calls = serve_same_node(&node, &token);
    let client = same_node_client(&node, &token).await;

    for (seed, size) in [(1, MIB), (2, 3 * MIB + 5)] {
        let id = ObjectId::random();
        let mut writer = client.create_here(id, size, OWNER).expect("the store has room at once");
        fill(&mut writer, seed);
        assert!(client.seal_here(writer, size).is_ok(), "sealed through the socket");
        let mapped = client
            .get_here(id)
            .expect("an object in memory is got through the socket");
        assert_eq!(mapped.len() as u64, size);
        assert!(follows_pattern(&mapped, seed));
        node.assert_holds(id, size, seed).await;
    }

    let shrunk = ObjectId::random();
    let mut writer = client.create_here(shrunk, 2 * MIB, OWNER).unwrap();
    fill(&mut writer[..MIB as usize], 3);
    assert!(client.seal_here(writer, MIB).is_ok(), "a seal may shrink the object");
    node.assert_holds(shrunk, MIB, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_needs_the_disk_is_declined_and_made_over_grpc() {
    let token = AuthToken::generate();
    let node = Node::start(&token, 10 * MIB).await;
    let _calls = serve_same_node(&node, &token);
    let client = same_node_client(&node, &token).await;
    let mut ids = Vec::new();
    for seed in 0..7 {
        ids.push(node.put(MIB, seed).await);
    }

    let eighth = ObjectId::random();
    assert!(
        client.create_here(eighth, MIB, OWNER).is_none(),
        "room would be made on disk"
    );
    assert_eq!(node.store.usage().spilled, 0, "and the declined create spilled nothing");
    let mut writer = client
        .create(eighth, MIB, OWNER, WAIT)
        .await
        .expect("gRPC spills to make room");
    fill(&mut writer, 7);
    client.seal(writer, MIB).await.unwrap();
    assert_eq!(node.store.usage().spilled, MIB);

    assert!(client.get_here(ids[0]).is_none(), "a spilled object is declined");
    assert!(
        follows_pattern(&client.get(ids[0]).await.unwrap(), 0),
        "gRPC restores it"
    );
    assert!(
        client.get_here(ObjectId::random()).is_none(),
        "an unknown object is declined"
    );
    let Err(error) = client.get(ObjectId::random()).await else {
        panic!("an unknown object is got over gRPC");
    };
    assert!(error.to_string().contains("not"), "gRPC says why: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_socket_or_once_it_is_gone_calls_take_grpc_at_once() {
    let token = AuthToken::generate();
    let node = Node::start(&token, 64 * MIB).await;
    let started = Instant::now();
    let client = same_node_client(&node, &token).await;
    assert!(client.create_here(ObjectId::random(), MIB, OWNER).is_none());
    assert!(started.elapsed() < Duration::from_secs(2), "no socket is no wait");
    node.put(MIB, 1).await;

    let calls = serve_same_node(&node, &token);
    let client = same_node_client(&node, &token).await;
    let id = ObjectId::random();
    let writer = client.create_here(id, MIB, OWNER).expect("served");
    drop(calls);
    let started = Instant::now();
    let unsealed = client.seal_here(writer, MIB).expect_err("the socket is gone");
    client
        .seal_unsealed(unsealed)
        .await
        .expect("the seal is made over gRPC");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(client.get_here(id).is_none());
    assert_eq!(client.get(id).await.unwrap().len() as u64, MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_the_clusters_token_is_refused() {
    let token = AuthToken::generate();
    let node = Node::start(&token, 64 * MIB).await;
    let _calls = serve_same_node(&node, &token);
    let channel = raylet_proto::channel::connect(&node.address, &token, WAIT)
        .await
        .unwrap();
    let stranger = SameNodeStore::new(&node.address, AuthToken::generate());
    let client = StoreClient::connect(channel, OWNER, Some(stranger)).await.unwrap();
    assert!(client.create_here(ObjectId::random(), MIB, OWNER).is_none());
    assert!(node.store.usage().objects.is_empty(), "nothing was created for it");
}
