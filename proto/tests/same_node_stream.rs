//! Task streams between processes of one machine, over the Unix socket a
//! worker binds beside its TCP port: the caller finds it by the worker's
//! TCP address, results reach the same-node reader thread (or a thread
//! waiting for them, which reads them itself), a frame larger than the
//! socket's buffer goes through the backlog, and a worker that dies inside
//! a frame, sends garbage or an absurd length ends the stream with an
//! error its handler hears. A socket file that a dead worker left is
//! passed over for TCP.

use std::sync::mpsc;
use std::time::Duration;

use prost::Message;
use raylet_common::auth::AuthToken;
use raylet_proto::local_socket;
use raylet_proto::task_stream::{self, EventHandler, StreamSocket};
use raylet_proto::v1::{LogLine, TaskBatch, TaskStreamHello, TaskStreamWelcome, WorkerEvents};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};

mod support;

use support::batch;

const PATIENCE: Duration = Duration::from_secs(2);

fn echo_of(batch: &TaskBatch) -> WorkerEvents {
    WorkerEvents {
        logs: vec![LogLine {
            function: batch.tasks[0].function.clone(),
            ..LogLine::default()
        }],
        ..WorkerEvents::default()
    }
}

/// A worker's listeners: a TCP port that nobody connects to when the Unix
/// socket beside it works, and that socket.
struct Worker {
    address: String,
    tcp: TcpListener,
    unix: UnixListener,
}

async fn worker() -> Worker {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = tcp.local_addr().unwrap();
    let path = local_socket::socket_for(address).expect("a socket folder in the temporary directory");
    let _ = std::fs::remove_file(&path);
    let unix = UnixListener::bind(&path).unwrap();
    Worker {
        address: address.to_string(),
        tcp,
        unix,
    }
}

/// Admits the first caller on `unix` and answers each batch it sends with
/// `answer`; gives the sizes of the batches' payloads once it closes.
fn serve(
    unix: UnixListener,
    token: &AuthToken,
    mut answer: impl FnMut(&TaskBatch) -> WorkerEvents + Send + 'static,
) -> tokio::task::JoinHandle<Vec<usize>> {
    let token = token.clone();
    tokio::spawn(async move {
        let (socket, _) = unix.accept().await.unwrap();
        let (mut tasks, results) = task_stream::accept(StreamSocket::Unix(socket), &token).await.unwrap();
        let mut sizes = Vec::new();
        while let Some(batch) = tasks.message().await.unwrap() {
            sizes.push(batch.tasks[0].task_id.len());
            results.send(&answer(&batch)).unwrap();
        }
        sizes
    })
}

/// What a handler hears, with the name of the thread that heard it.
type Heard = mpsc::Receiver<(Option<String>, Result<Option<WorkerEvents>, String>)>;

fn recording_handler() -> (EventHandler<WorkerEvents>, Heard) {
    let (heard, hearing) = mpsc::channel();
    let handler: EventHandler<WorkerEvents> = Box::new(move |event| {
        let thread = std::thread::current().name().map(str::to_string);
        let _ = heard.send((thread, event.map_err(|error| error.to_string())));
    });
    (handler, hearing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_stream_to_a_worker_on_its_machine_takes_the_unix_socket_and_its_results_reach_the_reader_thread() {
    let token = AuthToken::generate();
    let worker = worker().await;
    let address = worker.address.clone();
    let serving = serve(worker.unix, &token, echo_of);
    let (tasks, events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
    let (handler, heard) = recording_handler();
    events.deliver(handler);
    for index in 0..100 {
        tasks.send(&batch(&format!("call {index}"), 16)).unwrap();
    }
    for index in 0..100 {
        let (thread, event) = heard.recv_timeout(PATIENCE).unwrap();
        assert_eq!(thread.as_deref(), Some("raylet-local-reader"));
        assert_eq!(event.unwrap().unwrap().logs[0].function, format!("call {index}"));
    }
    drop(tasks);
    let (_, end) = heard.recv_timeout(PATIENCE).unwrap();
    assert_eq!(end, Ok(None), "the stream ends once the worker closes it");
    serving.await.unwrap();
    let nobody = tokio::time::timeout(Duration::from_millis(50), worker.tcp.accept()).await;
    assert!(nobody.is_err(), "the caller connected over TCP too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_waits_reads_its_result_itself() {
    let token = AuthToken::generate();
    let worker = worker().await;
    let address = worker.address.clone();
    serve(worker.unix, &token, |batch| {
        std::thread::sleep(Duration::from_millis(2));
        echo_of(batch)
    });
    let (tasks, events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
    let (handler, heard) = recording_handler();
    events.deliver(handler);
    let waiting = std::thread::Builder::new()
        .name("waiting caller".into())
        .spawn(move || {
            tasks.send(&batch("read me here", 16)).unwrap();
            let heard_here = std::cell::OnceCell::new();
            let done = || {
                if heard_here.get().is_none()
                    && let Ok(event) = heard.try_recv()
                {
                    let _ = heard_here.set(event);
                }
                heard_here.get().is_some()
            };
            let read = task_stream::read_last_sent_until(&done, Duration::from_secs(2));
            (read, heard_here.into_inner(), tasks)
        })
        .unwrap();
    let (read, event, _tasks) = waiting.join().unwrap();
    assert!(read);
    let (thread, event) = event.unwrap();
    assert_eq!(thread.as_deref(), Some("waiting caller"), "the waiting thread read it");
    assert_eq!(event.unwrap().unwrap().logs[0].function, "read me here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_the_sockets_buffer_arrives_whole_through_the_backlog() {
    let token = AuthToken::generate();
    let worker = worker().await;
    let address = worker.address.clone();
    let serving = serve(worker.unix, &token, |_| WorkerEvents {
        logs: vec![LogLine {
            line: "x".repeat(8 << 20),
            ..LogLine::default()
        }],
        ..WorkerEvents::default()
    });
    let (tasks, events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
    let (handler, heard) = recording_handler();
    events.deliver(handler);
    let sending = std::thread::spawn(move || {
        for payload in [16, 32 << 20, 16] {
            tasks.send(&batch("large", payload)).unwrap();
        }
    });
    for _ in 0..3 {
        let (_, event) = heard.recv_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(event.unwrap().unwrap().logs[0].line.len(), 8 << 20);
    }
    sending.join().unwrap();
    assert_eq!(serving.await.unwrap(), vec![16, 32 << 20, 16]);
}

/// Accepts one caller on the worker's Unix socket, welcomes it, and
/// writes `bytes` to it raw.
async fn raw_worker(worker: Worker, bytes: Vec<u8>) {
    let (mut socket, _) = worker.unix.accept().await.unwrap();
    let length = socket.read_u32().await.unwrap() as usize;
    let mut hello = vec![0; length];
    socket.read_exact(&mut hello).await.unwrap();
    TaskStreamHello::decode(&hello[..]).unwrap();
    let welcome = TaskStreamWelcome::default().encode_to_vec();
    socket.write_all(&(welcome.len() as u32).to_be_bytes()).await.unwrap();
    socket.write_all(&welcome).await.unwrap();
    write_then_close(socket, bytes).await;
}

async fn write_then_close(mut socket: UnixStream, bytes: Vec<u8>) {
    socket.write_all(&bytes).await.unwrap();
    socket.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_inside_a_frame_or_sends_garbage_ends_the_stream_with_an_error() {
    let token = AuthToken::generate();
    let whole = echo_of(&batch("whole", 16)).encode_to_vec();
    let mut cut = (whole.len() as u32).to_be_bytes().to_vec();
    cut.extend_from_slice(&whole[..whole.len() / 2]);
    let cases = [
        (cut, "ended inside a frame"),
        (vec![0x7f, 0xff, 0xff, 0xff], "over the limit"),
        (vec![0, 0, 0, 3, 0xff, 0xff, 0xff], "garbled"),
    ];
    for (bytes, said) in cases {
        let worker = worker().await;
        let address = worker.address.clone();
        let serving = tokio::spawn(raw_worker(worker, bytes));
        let (_tasks, events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
        let (handler, heard) = recording_handler();
        events.deliver(handler);
        let (_, event) = heard.recv_timeout(PATIENCE).unwrap();
        let error = event.unwrap_err();
        assert!(error.contains(said), "{said}: {error}");
        assert!(
            heard.recv_timeout(Duration::from_millis(100)).is_err(),
            "a handler hears the end once"
        );
        serving.await.unwrap();
    }
}

#[tokio::test]
async fn a_socket_file_a_dead_worker_left_is_passed_over_for_tcp() {
    let token = AuthToken::generate();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = tcp.local_addr().unwrap();
    let path = local_socket::socket_for(address).unwrap();
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "the dead worker's file stays");
    let worker_token = token.clone();
    tokio::spawn(async move {
        let (socket, _) = tcp.accept().await.unwrap();
        let (mut tasks, results) = task_stream::accept(StreamSocket::Tcp(socket), &worker_token)
            .await
            .unwrap();
        while let Some(batch) = tasks.message().await.unwrap() {
            results.send(&echo_of(&batch)).unwrap();
        }
    });
    let (tasks, mut events) = task_stream::open(&address.to_string(), &token, PATIENCE).await.unwrap();
    tasks.send(&batch("over tcp", 16)).unwrap();
    assert_eq!(events.message().await.unwrap().unwrap().logs[0].function, "over tcp");
}
