//! Same-node owner calls between real threads over a real Unix socket:
//! gets answered from the owner's table and borrower updates counted in
//! it, refused without the token, a stale socket or a dead owner sending
//! the caller to gRPC at once, garbage closing only its own connection,
//! and a caller that does not read its answers held back.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use raylet_common::auth::AuthToken;
use raylet_proto::ObjectId;
use raylet_proto::local_socket::socket_for;
use raylet_proto::owner_calls::{LocalOwners, OwnerCallServer, OwnerTable};
use raylet_proto::v1::{
    BorrowerChange, EncodedValue, ObjectOutcome, OwnerCall, UpdateBorrowersRequest, object_outcome, owner_call,
};

/// An owner's table of finished objects, and the borrower changes it was told.
#[derive(Clone, Default)]
struct Table {
    finished: Arc<Mutex<HashMap<ObjectId, ObjectOutcome>>>,
    borrowers: Arc<Mutex<Vec<(ObjectId, String, i32)>>>,
}

impl OwnerTable for Table {
    fn finished(&self, id: ObjectId) -> Option<ObjectOutcome> {
        self.finished.lock().unwrap().get(&id).cloned()
    }

    fn update_borrower(&self, id: ObjectId, borrower: &str, delta: i32) {
        self.borrowers.lock().unwrap().push((id, borrower.to_string(), delta));
    }
}

/// An owner at a TCP address of its own (held, so that no other process
/// takes the port its socket is named after), serving `table`.
struct Owner {
    _port: TcpListener,
    address: SocketAddr,
    table: Table,
    server: Option<OwnerCallServer>,
}

impl Owner {
    fn start(token: &AuthToken) -> Owner {
        let port = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = port.local_addr().unwrap();
        let table = Table::default();
        let server = OwnerCallServer::start(address, token.clone(), table.clone()).expect("the socket is bound");
        Owner {
            _port: port,
            address,
            table,
            server: Some(server),
        }
    }

    /// Finishes a new object with `data`.
    fn finish(&self, data: &[u8]) -> ObjectId {
        let id = ObjectId::random();
        self.table.finished.lock().unwrap().insert(id, value(data));
        id
    }

    fn name(&self) -> String {
        self.address.to_string()
    }
}

fn value(data: &[u8]) -> ObjectOutcome {
    ObjectOutcome {
        outcome: Some(object_outcome::Outcome::Value(EncodedValue {
            type_name: "bytes".into(),
            data: data.to_vec().into(),
            ..EncodedValue::default()
        })),
    }
}

#[test]
fn finished_objects_are_answered_and_others_send_the_getter_to_grpc() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let gets = LocalOwners::new(token);
    let small = owner.finish(b"small");
    let large = owner.finish(&vec![7u8; 1 << 20]);
    for _ in 0..1000 {
        assert_eq!(gets.finished(&owner.name(), small), Some(value(b"small")));
    }
    assert_eq!(gets.finished(&owner.name(), large), Some(value(&vec![7u8; 1 << 20])));
    assert_eq!(gets.finished(&owner.name(), ObjectId::random()), None);
    assert_eq!(
        gets.finished(&owner.name(), small),
        Some(value(b"small")),
        "the connection stays usable"
    );
}

fn change(id: ObjectId, borrower: &str, delta: i32) -> BorrowerChange {
    BorrowerChange {
        object_id: id.as_bytes().to_vec(),
        borrower_address: borrower.into(),
        delta,
    }
}

#[test]
fn borrower_updates_are_counted_in_order_and_one_with_a_bad_id_not_at_all() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let calls = LocalOwners::new(token);
    let (first, second) = (ObjectId::random(), ObjectId::random());
    let update = UpdateBorrowersRequest {
        changes: vec![change(first, "w:1", 1), change(second, "w:2", 2)],
    };
    assert!(calls.update_borrowers(&owner.name(), update).is_ok());
    let update = UpdateBorrowersRequest {
        changes: vec![change(first, "w:1", -1)],
    };
    assert!(calls.update_borrowers(&owner.name(), update).is_ok());
    let expected = vec![
        (first, "w:1".to_string(), 1),
        (second, "w:2".to_string(), 2),
        (first, "w:1".to_string(), -1),
    ];
    assert_eq!(*owner.table.borrowers.lock().unwrap(), expected);

    let mut bad = change(second, "w:2", -2);
    bad.object_id = vec![1, 2, 3];
    let update = UpdateBorrowersRequest {
        changes: vec![change(second, "w:2", -2), bad],
    };
    let back = calls.update_borrowers(&owner.name(), update.clone());
    assert_eq!(back, Err(update), "it comes back whole, to be sent over gRPC");
    assert_eq!(
        owner.table.borrowers.lock().unwrap().len(),
        3,
        "no change of it was counted"
    );
    assert!(
        calls.finished(&owner.name(), owner.finish(b"v")).is_some(),
        "later calls are answered"
    );
}

#[test]
fn a_borrower_update_larger_than_the_sockets_buffer_arrives_whole() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let calls = LocalOwners::new(token);
    let changes: Vec<_> = (0..20_000).map(|_| change(ObjectId::random(), "w:1", -1)).collect();
    let update = UpdateBorrowersRequest { changes };
    assert!(update.encoded_len() > 512 << 10, "over what a Unix socket buffers");
    assert!(
        calls.update_borrowers(&owner.name(), update).is_ok(),
        "sent through the socket, not gRPC"
    );
    assert_eq!(owner.table.borrowers.lock().unwrap().len(), 20_000);
}

#[test]
fn threads_get_at_once_each_on_a_connection_of_its_own() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let gets = Arc::new(LocalOwners::new(token));
    let ids: Vec<_> = (0..8u8).map(|i| (i, owner.finish(&[i]))).collect();
    let threads: Vec<_> = ids
        .into_iter()
        .map(|(i, id)| {
            let (gets, name) = (gets.clone(), owner.name());
            std::thread::spawn(move || {
                for _ in 0..500 {
                    assert_eq!(gets.finished(&name, id), Some(value(&[i])));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

#[test]
fn a_getter_without_the_clusters_token_gets_nothing() {
    let owner = Owner::start(&AuthToken::generate());
    let id = owner.finish(b"secret");
    let stranger = LocalOwners::new(AuthToken::generate());
    assert_eq!(stranger.finished(&owner.name(), id), None);
}

#[test]
fn a_stale_socket_or_a_dead_owner_sends_the_getter_to_grpc_at_once() {
    let token = AuthToken::generate();
    let mut owner = Owner::start(&token);
    let id = owner.finish(b"v");
    let gets = LocalOwners::new(token.clone());
    assert!(gets.finished(&owner.name(), id).is_some());
    drop(owner.server.take());
    let path = socket_for(owner.address).unwrap();
    assert!(!path.exists(), "a stopped owner removes its socket file");
    let started = Instant::now();
    assert_eq!(gets.finished(&owner.name(), id), None);
    assert_eq!(gets.finished(&owner.name(), id), None);

    let stale_port = TcpListener::bind("127.0.0.1:0").unwrap();
    let stale = stale_port.local_addr().unwrap();
    let _ = std::fs::remove_file(socket_for(stale).unwrap());
    drop(std::os::unix::net::UnixListener::bind(socket_for(stale).unwrap()).unwrap());
    assert_eq!(LocalOwners::new(token).finished(&stale.to_string(), id), None);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let _ = std::fs::remove_file(socket_for(stale).unwrap());
}

#[test]
fn garbage_closes_its_own_connection_and_no_other() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let id = owner.finish(b"v");
    let gets = LocalOwners::new(token);
    assert!(gets.finished(&owner.name(), id).is_some());
    for garbage in [
        &b"\xff\xff\xff\xff"[..],
        b"\x00\x00\x00\x03abc",
        b"\x00\x00\x00\x02\x0a\x00",
    ] {
        let mut peer = UnixStream::connect(socket_for(owner.address).unwrap()).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        peer.write_all(garbage).unwrap();
        let mut answer = Vec::new();
        let _ = peer.read_to_end(&mut answer);
        assert!(gets.finished(&owner.name(), id).is_some());
    }
}

#[test]
fn a_getter_that_reads_no_answers_is_not_read_either() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let id = owner.finish(&vec![1u8; 64 << 10]);
    let gets = LocalOwners::new(token.clone());
    assert!(gets.finished(&owner.name(), id).is_some());

    let mut flood = UnixStream::connect(socket_for(owner.address).unwrap()).unwrap();
    flood
        .write_all(&frame(&raylet_proto::v1::TaskStreamHello {
            token: token.expose().to_string(),
            protocol_version: raylet_proto::PROTOCOL_VERSION,
        }))
        .unwrap();
    flood.set_nonblocking(true).unwrap();
    let request = frame(&OwnerCall {
        call: Some(owner_call::Call::Get(raylet_proto::v1::GetObjectRequest {
            object_id: id.as_bytes().to_vec(),
            timeout_ms: 0,
        })),
    });
    let mut sent = 0usize;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        match flood.write(&request) {
            Ok(count) => sent += count,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => panic!("{error}"),
        }
    }
    assert!(
        sent < 64 << 20,
        "the owner kept reading {sent} bytes of requests whose answers were not read"
    );
    assert!(
        gets.finished(&owner.name(), id).is_some(),
        "other getters are still answered"
    );
}

fn frame(message: &impl prost::Message) -> Vec<u8> {
    let mut bytes = (message.encoded_len() as u32).to_be_bytes().to_vec();
    message.encode(&mut bytes).unwrap();
    bytes
}

#[test]
fn a_connection_that_sends_no_opening_frame_is_closed_after_the_handshake_timeout() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let id = owner.finish(b"v");
    let mut silent = UnixStream::connect(socket_for(owner.address).unwrap()).unwrap();
    let mut half_said = UnixStream::connect(socket_for(owner.address).unwrap()).unwrap();
    half_said.write_all(&[0, 0]).unwrap();
    let started = Instant::now();
    for peer in [&mut silent, &mut half_said] {
        peer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut answer = Vec::new();
        peer.read_to_end(&mut answer)
            .expect("closed by the owner, not timed out here");
        assert!(answer.is_empty(), "no welcome without an opening frame");
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(9),
        "closed after {waited:?}, before its timeout"
    );
    let gets = LocalOwners::new(token);
    assert!(
        gets.finished(&owner.name(), id).is_some(),
        "the owner still answers others"
    );
}
