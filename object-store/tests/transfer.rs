//! Node-to-node object transfer over real gRPC and plain TCP on loopback:
//! several stores in one process, each serving its own ports, with real
//! memfds.

mod common;

use std::time::{Duration, Instant};

use common::{MIB, Node, OWNER, Serving, WAIT, cluster};
use raylet_common::auth::AuthToken;
use raylet_object_store::StoreError;
use raylet_proto::ObjectId;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::ReadChunksRequest;
use raylet_proto::v1::object_store_service_client::ObjectStoreServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An address where nothing listens.
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_object_pulled_from_another_store_maps_with_the_same_bytes() {
    let (_token, nodes) = cluster(2, 2 << 30).await;
    let [a, b] = &nodes[..] else { unreachable!() };
    let size = 256 * MIB + 12_345;
    let id = a.put(size, 7).await;
    b.pull(id, size, &[a]).await.unwrap();
    b.assert_holds(id, size, 7).await;
    assert_eq!((a.served(), b.pulled()), (size, size));
    let object = &b.store.usage().objects[0];
    assert_eq!((object.id, object.owner.as_str(), object.sealed), (id, OWNER, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pulls_of_one_object_transfer_it_once() {
    let (_token, nodes) = cluster(2, 1 << 30).await;
    let [a, b] = &nodes[..] else { unreachable!() };
    let size = 64 * MIB + 1;
    let id = a.put(size, 3).await;
    let mut pulls = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, sources) = (b.client.clone(), vec![a.address.clone()]);
        pulls.spawn(async move { client.pull(id, size, OWNER, &sources, WAIT).await });
    }
    for result in pulls.join_all().await {
        result.unwrap();
    }
    b.assert_holds(id, size, 3).await;
    b.pull(id, size, &[a]).await.unwrap();
    assert_eq!((a.served(), b.pulled()), (size, size));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broadcast_is_served_by_the_nodes_that_already_hold_the_object() {
    let (_token, nodes) = cluster(4, 1 << 30).await;
    let [a, b, c, d] = &nodes[..] else { unreachable!() };
    let size = 96 * MIB;
    let id = a.put(size, 11).await;
    b.pull(id, size, &[a]).await.unwrap();
    let sources = [a, b];
    let (from_c, from_d) = tokio::join!(c.pull(id, size, &sources), d.pull(id, size, &sources));
    from_c.unwrap();
    from_d.unwrap();
    for node in [b, c, d] {
        node.assert_holds(id, size, 11).await;
        assert_eq!(node.pulled(), size);
    }
    assert!(a.served() < 3 * size, "A served {} of 3 × {size}", a.served());
    assert!(b.served() > 0, "B served nothing");
    assert_eq!(a.served() + b.served(), 3 * size);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pull_uses_the_other_sources_when_one_lacks_the_object_or_is_down() {
    let (_token, nodes) = cluster(3, 1 << 30).await;
    let [a, b, empty] = &nodes[..] else { unreachable!() };
    let size = 80 * MIB;
    let id = a.put(size, 5).await;
    let sources = [dead_address(), empty.address.clone(), a.address.clone()];
    b.client.pull(id, size, OWNER, &sources, WAIT).await.unwrap();
    b.assert_holds(id, size, 5).await;
    assert_eq!((a.served(), empty.served()), (size, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pull_with_no_good_source_fails_naming_each_and_leaves_nothing_behind() {
    let (_token, nodes) = cluster(3, 1 << 30).await;
    let [a, b, empty] = &nodes[..] else { unreachable!() };
    let size = 48 * MIB;
    let id = a.put(size, 1).await;
    let before = b.store.usage();
    let dead = dead_address();
    let sources = [dead.clone(), empty.address.clone()];
    let started = Instant::now();
    let error = b.client.pull(id, size, OWNER, &sources, WAIT).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::PullFailed { id: failed, .. } if *failed == id),
        "the client gets the store's own variant: {error:?}"
    );
    let error = error.to_string();
    assert!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    for needle in [id.to_string(), dead, empty.address.clone(), "could not reach".into()] {
        assert!(error.contains(&needle), "{needle} is not in: {error}");
    }
    assert_eq!(b.store.usage(), before);
    let wrong_size = b.pull(id, size + 1, &[a]).await.unwrap_err().to_string();
    assert!(wrong_size.contains("bytes"), "{wrong_size}");
    assert_eq!(b.store.usage().objects, before.objects);
    let missing = b.client.get(id).await.err();
    assert!(
        matches!(missing, Some(StoreError::NotFound(missing)) if missing == id),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spilled_object_is_restored_to_be_served() {
    let (_token, nodes) = cluster(2, 64 * MIB).await;
    let [a, b] = &nodes[..] else { unreachable!() };
    let first = a.put(40 * MIB, 21).await;
    a.put(40 * MIB, 22).await;
    assert!(a.store.usage().objects.iter().any(|o| o.id == first && o.spilled));
    b.pull(first, 40 * MIB, &[a]).await.unwrap();
    b.assert_holds(first, 40 * MIB, 21).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pull_into_a_full_store_fails_with_no_room_and_leaves_nothing() {
    let (_token, nodes) = cluster(2, 64 * MIB).await;
    let [a, b] = &nodes[..] else { unreachable!() };
    let id = a.put(48 * MIB, 2).await;
    let pinned = b.put(48 * MIB, 3).await;
    let _reading = b.client.get(pinned).await.unwrap();
    let sources = [a.address.clone()];
    let error = b.client.pull(id, 48 * MIB, OWNER, &sources, Duration::from_millis(300));
    let error = error.await.unwrap_err();
    assert!(matches!(error, StoreError::Full(_)), "{error:?}");
    assert!(error.to_string().contains("full"), "{error}");
    assert_eq!(b.store.usage().objects.len(), 1);
    assert_eq!(a.served(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_read_requests_are_refused_not_panicked_on() {
    let (token, nodes) = cluster(1, 1 << 30).await;
    let a = &nodes[0];
    let size = 3 * MIB;
    let id = a.put(size, 9).await;
    let mut rpc = client(&a.address, &token).await;
    let id_bytes = id.as_bytes().to_vec();
    let past_the_end = (read(id_bytes.clone(), 0, size + 1), tonic::Code::InvalidArgument);
    for (request, code) in bad_ranges(&id_bytes, size).into_iter().chain([past_the_end]) {
        let status = rpc.read_chunks(request).await.err().map(|status| status.code());
        assert_eq!(status, Some(code));
    }
    let mut chunks = rpc.read_chunks(read(id_bytes, MIB, 0)).await.unwrap().into_inner();
    let mut offsets = Vec::new();
    while let Some(chunk) = chunks.message().await.unwrap() {
        assert_eq!(chunk.object_size, size);
        offsets.push((chunk.offset, chunk.data.len() as u64));
    }
    assert_eq!(offsets, vec![(MIB, 2 * MIB)]);
    wait_until_unpinned(a, "a finished read must unpin its object").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_source_that_dies_mid_pull_leaves_the_rest_to_another() {
    let (_token, mut nodes) = cluster(3, 2 << 30).await;
    let size = 512 * MIB + 3;
    let id = nodes[0].put(size, 13).await;
    nodes[2].pull(id, size, &[&nodes[0]]).await.unwrap();
    let dying = nodes.remove(0);
    let [b, c] = &nodes[..] else { unreachable!() };
    let served_to_c = dying.served();
    let sources = [dying.address.clone(), c.address.clone()];
    let pull = tokio::spawn({
        let client = b.client.clone();
        async move { client.pull(id, size, OWNER, &sources, WAIT).await }
    });
    while b.pulled() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let dead_store = dying.store.clone();
    drop(dying);
    pull.await.unwrap().unwrap();
    b.assert_holds(id, size, 13).await;
    let served_by_dead = dead_store.usage().served - served_to_c;
    assert!(
        served_by_dead < size / 2,
        "it died after serving its share: {served_by_dead}"
    );
    assert!(
        c.served() + served_by_dead >= size,
        "the other source served the rest: {} + {served_by_dead} of {size}, pulled {}",
        c.served(),
        b.pulled()
    );
    assert_eq!(b.pulled(), size, "each byte is written once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_without_a_transfer_port_is_read_through_grpc() {
    let token = raylet_common::auth::AuthToken::generate();
    let a = Node::serving(&token, 1 << 30, Serving::GrpcOnly).await;
    let b = Node::start(&token, 1 << 30).await;
    let size = 40 * MIB + 7;
    let id = a.put(size, 17).await;
    b.pull(id, size, &[&a]).await.unwrap();
    b.assert_holds(id, size, 17).await;
    assert_eq!((a.served(), b.pulled()), (size, size));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transfer_port_serves_a_range_once_and_only_for_its_ticket() {
    let (token, nodes) = cluster(1, 1 << 30).await;
    let a = &nodes[0];
    let size = 3 * MIB;
    let id = a.put(size, 9).await;
    let mut rpc = client(&a.address, &token).await;
    let id_bytes = id.as_bytes().to_vec();
    for (request, code) in bad_ranges(&id_bytes, size) {
        let status = rpc.open_transfer(request).await.err().map(|status| status.code());
        assert_eq!(status, Some(code));
    }
    let ticket = rpc.open_transfer(read(id_bytes, MIB, 0)).await.unwrap().into_inner();
    assert_eq!((ticket.object_size, ticket.ticket.len()), (size, 16));
    let port = u16::try_from(ticket.port).unwrap();
    let wrong: Vec<u8> = ticket.ticket.iter().map(|byte| byte ^ 1).collect();
    assert!(
        read_with_ticket(port, &wrong).await.is_empty(),
        "a wrong ticket reads nothing"
    );
    let bytes = read_with_ticket(port, &ticket.ticket).await;
    let mapped = a.client.get(id).await.unwrap();
    assert!(bytes[..] == mapped[MIB as usize..], "the ticket reads its range");
    assert!(
        read_with_ticket(port, &ticket.ticket).await.is_empty(),
        "a ticket reads once"
    );
    drop(mapped);
    wait_until_unpinned(a, "a finished transfer must unpin its object").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_without_tickets_from_one_address_cannot_keep_its_pullers_out() {
    let (token, nodes) = cluster(1, 1 << 30).await;
    let a = &nodes[0];
    let size = MIB;
    let id = a.put(size, 5).await;
    let mut rpc = client(&a.address, &token).await;
    let ticket = rpc
        .open_transfer(read(id.as_bytes().to_vec(), 0, 0))
        .await
        .unwrap()
        .into_inner();
    let port = u16::try_from(ticket.port).unwrap();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    let bytes = read_with_ticket(port, &ticket.ticket).await;
    assert_eq!(
        bytes.len() as u64,
        size,
        "the ticketed connection is served beside 300 idle ones"
    );
    let mut closed = 0;
    for stream in &mut idle {
        let read = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut [0; 1])).await;
        closed += usize::from(matches!(read, Ok(Ok(0)) | Ok(Err(_))));
    }
    assert!(closed >= 290, "the idle ones were closed to make room: {closed} of 300");
}

/// Ranges a read (of chunks, or through a ticket) must refuse, with the
/// status each gets: a malformed id, a range starting at the end, an
/// overflowing length, an unknown object.
fn bad_ranges(id_bytes: &[u8], size: u64) -> [(ReadChunksRequest, tonic::Code); 4] {
    [
        (read(vec![1, 2, 3], 0, 0), tonic::Code::InvalidArgument),
        (read(id_bytes.to_vec(), size, 0), tonic::Code::InvalidArgument),
        (read(id_bytes.to_vec(), 1, u64::MAX), tonic::Code::InvalidArgument),
        (
            read(ObjectId::random().as_bytes().to_vec(), 0, 0),
            tonic::Code::NotFound,
        ),
    ]
}

/// What a connection to the transfer port that sends `ticket` reads.
async fn read_with_ticket(port: u16, ticket: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(ticket).await.unwrap();
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).await.unwrap();
    bytes
}

/// A timing, not a test: `cargo test --release -p raylet-object-store --test
/// transfer -- --ignored --nocapture`. Prints GB/s of each pull of 1 GiB and
/// GB per CPU-second of this process (both stores), which varies less on a
/// busy machine.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a timing; run it in a release build"]
async fn pull_throughput() {
    let (_token, nodes) = cluster(2, 4 << 30).await;
    let [a, b] = &nodes[..] else { unreachable!() };
    let size = 1 << 30;
    let id = a.put(size, 1).await;
    for _ in 0..6 {
        let (started, cpu_before) = (Instant::now(), cpu_seconds());
        b.pull(id, size, &[a]).await.unwrap();
        let (seconds, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu_before);
        println!(
            "{:.2} GB/s, {:.2} GB per CPU-second",
            size as f64 / seconds / 1e9,
            size as f64 / cpu / 1e9
        );
        b.client.delete(&[id]).await.unwrap();
    }
}

fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let seconds = |time: nix::sys::time::TimeVal| time.tv_sec() as f64 + time.tv_usec() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}

/// Waits until `node`'s only object is pinned no more; panics with `why`
/// when it stays pinned past the tests' patience.
async fn wait_until_unpinned(node: &Node, why: &str) {
    let deadline = Instant::now() + WAIT;
    while node.store.usage().objects[0].pins > 0 {
        assert!(Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A gRPC client of the store at `address`, with the cluster's token.
async fn client(address: &str, token: &AuthToken) -> ObjectStoreServiceClient<AuthedChannel> {
    let channel = raylet_proto::channel::connect(address, token, WAIT).await.unwrap();
    ObjectStoreServiceClient::new(channel)
}

/// A request for `length` bytes of `object_id` from `offset`, in chunks of
/// the store's choice.
fn read(object_id: Vec<u8>, offset: u64, length: u64) -> ReadChunksRequest {
    ReadChunksRequest {
        object_id,
        offset,
        length,
        chunk_size: 0,
    }
}
