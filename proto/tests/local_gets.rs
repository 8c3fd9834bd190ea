//! Same-node gets between real threads over a real Unix socket: answered
//! from the owner's table, refused without the token, a stale socket or a
//! dead owner sending the getter to gRPC at once, garbage closing only its
//! own connection, and a getter that does not read its answers held back.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raylet_common::auth::AuthToken;
use raylet_proto::ObjectId;
use raylet_proto::local_gets::{LocalGets, OwnerGetServer};
use raylet_proto::local_socket::socket_for;
use raylet_proto::v1::{EncodedValue, ObjectOutcome, object_outcome};

/// An owner's table of finished objects.
type Table = Arc<Mutex<HashMap<ObjectId, ObjectOutcome>>>;

/// An owner at a TCP address of its own (held, so that no other process
/// takes the port its socket is named after), serving `table`.
struct Owner {
    _port: TcpListener,
    address: SocketAddr,
    table: Table,
    server: Option<OwnerGetServer>,
}

impl Owner {
    fn start(token: &AuthToken) -> Owner {
        let port = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = port.local_addr().unwrap();
        let table = Table::default();
        let lookup_table = table.clone();
        let lookup = move |id| lookup_table.lock().unwrap().get(&id).cloned();
        let server = OwnerGetServer::start(address, token.clone(), Box::new(lookup)).expect("the socket is bound");
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
        self.table.lock().unwrap().insert(id, value(data));
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
    let gets = LocalGets::new(token);
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

#[test]
fn threads_get_at_once_each_on_a_connection_of_its_own() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let gets = Arc::new(LocalGets::new(token));
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
    let stranger = LocalGets::new(AuthToken::generate());
    assert_eq!(stranger.finished(&owner.name(), id), None);
}

#[test]
fn a_stale_socket_or_a_dead_owner_sends_the_getter_to_grpc_at_once() {
    let token = AuthToken::generate();
    let mut owner = Owner::start(&token);
    let id = owner.finish(b"v");
    let gets = LocalGets::new(token.clone());
    assert!(gets.finished(&owner.name(), id).is_some());
    drop(owner.server.take());
    let path = socket_for(owner.address).unwrap();
    assert!(!path.exists(), "a stopped owner removes its socket file");
    let started = Instant::now();
    assert_eq!(gets.finished(&owner.name(), id), None);
    assert_eq!(gets.finished(&owner.name(), id), None);

    let stale_port = TcpListener::bind("127.0.0.1:0").unwrap();
    let stale = stale_port.local_addr().unwrap();
    drop(std::os::unix::net::UnixListener::bind(socket_for(stale).unwrap()).unwrap());
    assert_eq!(LocalGets::new(token).finished(&stale.to_string(), id), None);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let _ = std::fs::remove_file(socket_for(stale).unwrap());
}

#[test]
fn garbage_closes_its_own_connection_and_no_other() {
    let token = AuthToken::generate();
    let owner = Owner::start(&token);
    let id = owner.finish(b"v");
    let gets = LocalGets::new(token);
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
    let gets = LocalGets::new(token.clone());
    assert!(gets.finished(&owner.name(), id).is_some());

    let mut flood = UnixStream::connect(socket_for(owner.address).unwrap()).unwrap();
    flood
        .write_all(&frame(&raylet_proto::v1::TaskStreamHello {
            token: token.expose().to_string(),
            protocol_version: raylet_proto::PROTOCOL_VERSION,
        }))
        .unwrap();
    flood.set_nonblocking(true).unwrap();
    let request = frame(&raylet_proto::v1::GetObjectRequest {
        object_id: id.as_bytes().to_vec(),
        timeout_ms: 0,
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
