//! A real head process under hostile load: messages over each service's
//! size bound, a flood of idle and garbage connections, one client sending
//! more requests at once than it may, and one connection opening more
//! streams than it may. The head refuses what is over a bound with a clear
//! error (or, for streams, makes the client wait), keeps serving everybody
//! else, and its memory stays flat. A driver calling more actors than a
//! connection may open streams follows them all over one. The bounds are lowered through their variables so
//! that the test reaches them quickly.

use crate::common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemons, RAYLET, Tally, daemon_pids, head_address};
use raylet::{Bundle, Config, Error, PlacementGroup, PlacementStrategy};
use raylet_common::auth::{AuthToken, ClientAuth};
use raylet_proto::v1::job_service_client::JobServiceClient;
use raylet_proto::v1::kv_service_client::KvServiceClient;
use raylet_proto::v1::placement_group_service_client::PlacementGroupServiceClient;
use raylet_proto::v1::{BlobChunk, KvPutRequest, WaitPlacementGroupRequest};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Where flooding clients connect from: a loopback address of its own, so
/// that the bounds per client do not touch the test's other connections.
const FLOODER: &str = "127.0.0.2";

/// Starts a head with one CPU and `limits` as its environment.
fn start_head(temp: &Path, limits: &[(&str, &str)]) -> String {
    start_head_with(temp, &[], limits)
}

/// Starts a head with one CPU, `extra` flags and `limits` as its
/// environment; its address.
fn start_head_with(temp: &Path, extra: &[&str], limits: &[(&str, &str)]) -> String {
    let output = Command::new(RAYLET)
        .args(["start", "--head", "--port", "0", "--num-cpus", "1", "--temp-dir"])
        .arg(temp)
        .args(extra)
        .envs(limits.iter().copied())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    head_address(temp)
}

fn token(temp: &Path) -> AuthToken {
    AuthToken::parse(
        std::fs::read_to_string(temp.join("session_latest/token"))
            .unwrap()
            .trim(),
    )
    .unwrap()
}

/// Resident memory of `pid`, in bytes.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

async fn channel_from(head: &str, local: Option<IpAddr>) -> Channel {
    Endpoint::from_shared(format!("http://{head}"))
        .unwrap()
        .local_address(local)
        .connect()
        .await
        .unwrap()
}

type Authed = InterceptedService<Channel, ClientAuth>;

fn authed(channel: Channel, token: &AuthToken) -> Authed {
    InterceptedService::new(channel, ClientAuth::new(token))
}

/// A KvPut of `bytes` bytes of value; the status it got.
async fn put_value(client: &mut KvServiceClient<Authed>, bytes: usize) -> Result<(), tonic::Status> {
    let request = KvPutRequest {
        namespace: "limits".into(),
        key: b"big".to_vec(),
        value: vec![7; bytes],
        overwrite: true,
    };
    client.kv_put(request).await.map(|_| ())
}

/// One blob upload whose single chunk is `bytes` long.
async fn upload_chunk(client: &mut JobServiceClient<Authed>, bytes: usize) -> Result<(), tonic::Status> {
    let chunk = BlobChunk {
        blob: None,
        data: vec![1; bytes].into(),
    };
    client.upload_blob(tokio_stream::iter([chunk])).await.map(|_| ())
}

/// A unary call over the bound fails with OUT_OF_RANGE; a stream's message
/// over it ends the stream, which the service reports as INVALID_ARGUMENT.
/// Either way the message gives the size and the limit.
fn assert_too_large(refused: tonic::Status, what: &str) {
    let codes = [tonic::Code::OutOfRange, tonic::Code::InvalidArgument];
    assert!(codes.contains(&refused.code()), "{what}: {refused}");
    assert!(
        refused.message().contains("too large") && refused.message().contains("the limit is"),
        "{what}: {refused}"
    );
}

#[test]
fn the_head_refuses_oversized_messages_and_connection_floods_and_its_memory_stays_flat() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_head(temp.path(), &[("RAYLET_MAX_CONNECTIONS_PER_CLIENT", "100")]);
    let head_pid = daemon_pids(temp.path(), "head")[0];
    let token = token(temp.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let before = resident_bytes(head_pid);

    runtime.block_on(async {
        let channel = channel_from(&head, None).await;
        let mut kv = KvServiceClient::new(authed(channel.clone(), &token));
        for _ in 0..4 {
            assert_too_large(put_value(&mut kv, 64 << 20).await.unwrap_err(), "a 64 MiB KV value");
        }
        put_value(&mut kv, 1 << 20).await.expect("a 1 MiB value is stored");
        let mut jobs = JobServiceClient::new(authed(channel.clone(), &token));
        assert_too_large(
            upload_chunk(&mut jobs, 32 << 20).await.unwrap_err(),
            "a 32 MiB upload chunk",
        );
        let stranger = authed(channel, &AuthToken::generate());
        let refused = put_value(&mut KvServiceClient::new(stranger), 64 << 20)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    });

    let address: SocketAddr = head.parse().unwrap();
    let flood: Vec<TcpStream> = (0..1000).map(|i| open_from_flooder(address, i)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let closed_at_once = flood.into_iter().filter(closed_by_the_head).count();
    assert!(
        closed_at_once >= 850,
        "{closed_at_once} of 1000 flooding connections were closed at once (100 may stay)"
    );
    let status = Command::new(RAYLET)
        .args(["status", "--temp-dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    assert!(status.status.success(), "the head serves others during a flood");

    let after = resident_bytes(head_pid);
    let grown = after.saturating_sub(before);
    eprintln!(
        "{closed_at_once} of 1000 flooding connections closed at once; head RSS {} MiB before, {} MiB after",
        before >> 20,
        after >> 20
    );
    assert!(
        grown < 96 << 20,
        "the head grew by {} MiB under oversized messages and a flood",
        grown >> 20
    );
    let again = open_from_flooder(address, 1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !closed_by_the_head(&again),
        "a flooder's place comes back once its connections closed"
    );
}

/// A connection from [`FLOODER`]; every third sends garbage, the others
/// nothing.
fn open_from_flooder(head: SocketAddr, index: usize) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: SocketAddr = format!("{FLOODER}:0").parse().unwrap();
    socket.bind(&local.into()).unwrap();
    socket.connect(&head.into()).unwrap();
    let mut stream: TcpStream = socket.into();
    if index.is_multiple_of(3) {
        let _ = stream.write_all(b"\x16\x03\x01garbage that is not HTTP/2\r\n\r\n");
    }
    stream
}

/// Whether the head has closed (or reset) `stream`: what it sent is read
/// without waiting, then its end.
fn closed_by_the_head(stream: &TcpStream) -> bool {
    let mut stream = stream;
    stream.set_nonblocking(true).unwrap();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// A placement group that stays pending: the head's one CPU is held by
/// another group. Waiting for it is a request that stays in flight.
fn pending_group(driver: &raylet::Cluster) -> (PlacementGroup, PlacementGroup) {
    let one_cpu = || vec![Bundle::new().num_cpus(1.0)];
    let holder = driver.placement_group(one_cpu(), PlacementStrategy::Pack).unwrap();
    holder.ready_timeout(Duration::from_secs(20)).unwrap();
    let pending = driver.placement_group(one_cpu(), PlacementStrategy::Pack).unwrap();
    (holder, pending)
}

/// `count` concurrent waits of `timeout_ms` for `group` on one connection
/// from [`FLOODER`]; each reply with when it came.
async fn wait_concurrently(
    head: &str,
    token: &AuthToken,
    group: &PlacementGroup,
    count: usize,
    timeout_ms: u64,
) -> Vec<(Result<(), tonic::Status>, Duration)> {
    let channel = channel_from(head, Some(FLOODER.parse().unwrap())).await;
    // An HTTP/2 client learns the server's stream bound from its SETTINGS;
    // streams it opens before they arrive may be refused, so one call
    // finishes the handshake first.
    let warm_up = WaitPlacementGroupRequest {
        placement_group_id: group.id().as_bytes().to_vec(),
        timeout_ms: 1,
    };
    let _ = PlacementGroupServiceClient::new(authed(channel.clone(), token))
        .wait_placement_group(warm_up)
        .await;
    let started = Instant::now();
    let calls = (0..count).map(|_| {
        let mut groups = PlacementGroupServiceClient::new(authed(channel.clone(), token));
        let request = WaitPlacementGroupRequest {
            placement_group_id: group.id().as_bytes().to_vec(),
            timeout_ms,
        };
        async move {
            let reply = groups.wait_placement_group(request).await.map(|_| ());
            (reply, started.elapsed())
        }
    });
    futures_util::future::join_all(calls).await
}

#[test]
fn a_client_with_too_many_requests_in_flight_is_refused_and_others_are_served() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_head(temp.path(), &[("RAYLET_MAX_REQUESTS_PER_CLIENT", "4")]);
    let token = token(temp.path());
    let driver = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let (_holder, pending) = pending_group(&driver);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let replies = runtime.block_on(wait_concurrently(&head, &token, &pending, 12, 3000));
    let refused: Vec<tonic::Status> = replies.iter().filter_map(|(r, _)| r.as_ref().err().cloned()).collect();
    let answered = replies.len() - refused.len();
    assert_eq!(answered, 4, "four waits are served at once: {refused:?}");
    assert_eq!(refused.len(), 8);
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
        assert!(status.message().contains("4 requests in flight"), "{status}");
    }
    assert!(
        driver.list_placement_groups().is_ok(),
        "the driver's own calls still go through"
    );
    driver.shutdown().unwrap();
}

#[test]
fn a_connection_over_its_stream_bound_waits_instead_of_failing() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_head(temp.path(), &[("RAYLET_MAX_STREAMS_PER_CONNECTION", "2")]);
    let token = token(temp.path());
    let driver = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let (_holder, pending) = pending_group(&driver);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let replies = runtime.block_on(wait_concurrently(&head, &token, &pending, 6, 1000));
    for (reply, _) in &replies {
        assert!(reply.is_ok(), "every wait is answered: {reply:?}");
    }
    let last = replies.iter().map(|(_, at)| *at).max().unwrap();
    assert!(
        last >= Duration::from_millis(2900),
        "six one-second waits, two at a time on one connection, end after three seconds, not {last:?}"
    );
    driver.shutdown().unwrap();
}

#[test]
fn a_driver_follows_more_actors_than_a_connection_may_open_streams() {
    const STREAMS: usize = 8;
    const ACTORS: u64 = 3 * STREAMS as u64;
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let bound = STREAMS.to_string();
    let head = start_head(temp.path(), &[("RAYLET_MAX_STREAMS_PER_CONNECTION", &bound)]);
    let driver = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let tallies: Vec<_> = (0..ACTORS)
        .map(|start| Tally::remote(&driver, start).num_cpus(0.0).spawn().unwrap())
        .collect();
    let sums: Vec<_> = tallies.iter().map(|tally| tally.add(1000)).collect();
    let patience = Duration::from_secs(60);
    for (start, sum) in (0..ACTORS).zip(&sums) {
        let sum = driver.get_timeout(sum, patience);
        assert_eq!(sum.unwrap(), 1000 + start, "actor {start} of {ACTORS} answered");
    }
    let last = tallies.last().unwrap();
    driver.kill(last, true).unwrap();
    let Err(Error::Task(error)) = driver.get_timeout(&last.add(1), patience) else {
        panic!("the head's record of the kill reaches the driver, and calls fail")
    };
    assert!(error.is_actor_death(), "{error}");
    driver.shutdown().unwrap();
}

/// Starts a head with one CPU, its dashboard and `limits` as its
/// environment; its gRPC and dashboard addresses.
fn start_head_with_dashboard(temp: &Path, limits: &[(&str, &str)]) -> (String, String) {
    let head = start_head_with(temp, &["--dashboard-port", "0"], limits);
    (head, common::http::session_file(temp, "dashboard_address"))
}

/// The body each stalled login announces or sends: about what axum
/// buffered per request before the login's bound.
const LOGIN_FLOOD_BODY: usize = 1900 << 10;

/// `count` HTTP/1 logins that announce a body of [`LOGIN_FLOOD_BODY`] bytes,
/// send it, and then hold their connections open.
async fn stalled_http1_logins(dashboard: &str, count: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let logins = (0..count).map(|_| async {
        let mut stream = tokio::net::TcpStream::connect(dashboard).await.unwrap();
        let head = format!(
            "POST /login HTTP/1.1\r\nHost: {dashboard}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\n\r\ntoken=",
            LOGIN_FLOOD_BODY + 6
        );
        let body = vec![b'a'; LOGIN_FLOOD_BODY];
        let sent = async {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body).await
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), sent).await;
        stream
    });
    futures_util::future::join_all(logins).await
}

/// One HTTP/2 connection opening up to `count` login streams without a
/// length, each sending [`LOGIN_FLOOD_BODY`] bytes and never ending; the
/// streams it opened and the server's bound on streams at once.
async fn stalled_http2_logins(dashboard: &str, count: usize) -> (h2::client::SendRequest<bytes::Bytes>, usize, usize) {
    let tcp = tokio::net::TcpStream::connect(dashboard).await.unwrap();
    let (mut client, mut connection) = h2::client::handshake(tcp).await.unwrap();
    // Driving the connection a moment reads the server's SETTINGS.
    let _ = tokio::time::timeout(Duration::from_millis(300), &mut connection).await;
    let stream_bound = connection.max_concurrent_send_streams();
    tokio::spawn(connection);
    let mut opened = 0;
    for _ in 0..count {
        let Ok(Ok(ready)) = tokio::time::timeout(Duration::from_millis(500), client.clone().ready()).await else {
            break;
        };
        client = ready;
        let request = http::Request::post(format!("http://{dashboard}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(())
            .unwrap();
        let Ok((_, mut body)) = client.send_request(request, false) else {
            break;
        };
        let _ = body.send_data(bytes::Bytes::from(vec![b'a'; LOGIN_FLOOD_BODY]), false);
        std::mem::forget(body);
        opened += 1;
    }
    (client, opened, stream_bound)
}

#[test]
fn stalled_logins_over_http1_and_http2_leave_the_heads_memory_within_its_bound() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (_, dashboard) = start_head_with_dashboard(temp.path(), &[]);
    let head_pid = daemon_pids(temp.path(), "head")[0];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let before = resident_bytes(head_pid);

    let (http1, (http2, streams, stream_bound)) = runtime.block_on(async {
        let http1 = stalled_http1_logins(&dashboard, 150).await;
        (http1, stalled_http2_logins(&dashboard, 150).await)
    });
    std::thread::sleep(Duration::from_secs(2));
    let during = resident_bytes(head_pid);
    eprintln!(
        "head RSS {} MiB before, {} MiB with 150 stalled HTTP/1 logins and {streams} stalled HTTP/2 streams",
        before >> 20,
        during >> 20
    );
    assert_eq!(stream_bound, 64, "the streams one connection may have open at once");
    let grown = during.saturating_sub(before);
    assert!(grown < 48 << 20, "the head grew by {} MiB", grown >> 20);
    let (status, body) = common::http::get(&dashboard, "/healthz", None);
    assert_eq!((status, body.as_str()), (200, "ok\n"), "the dashboard serves others");
    drop((http1, http2));
}

/// A connection from the CLI's own address that sends `opening` and then
/// nothing.
fn idle_connection(address: &str, opening: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.write_all(opening).unwrap();
    stream
}

#[test]
fn idle_and_half_open_connections_from_the_clis_address_neither_lock_it_out_nor_stay() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let limits = [("RAYLET_MAX_CONNECTIONS_PER_CLIENT", "300")];
    let (head, dashboard) = start_head_with_dashboard(temp.path(), &limits);
    let half_preface = &b"PRI * HTTP/2.0\r\n"[..];
    let mut idle = Vec::new();
    for index in 0..400 {
        let opening = if index % 2 == 0 { &b""[..] } else { half_preface };
        idle.push(idle_connection(&head, opening));
        let request = if index % 2 == 0 {
            &b""[..]
        } else {
            &b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"[..]
        };
        idle.push(idle_connection(&dashboard, request));
    }
    let opened = Instant::now();
    let status = Command::new(RAYLET)
        .args(["status", "--temp-dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "raylet status gets in beside 400 idle connections from its address: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let (code, body) = common::http::get(&dashboard, "/healthz", None);
    assert_eq!(
        (code, body.as_str()),
        (200, "ok\n"),
        "so does the dashboard's health check"
    );

    std::thread::sleep(Duration::from_secs(13).saturating_sub(opened.elapsed()));
    let staying = idle.iter().filter(|stream| !closed_by_the_head(stream)).count();
    assert_eq!(
        staying, 0,
        "{staying} of 800 idle or half-open connections are still open after 13 s"
    );
}
