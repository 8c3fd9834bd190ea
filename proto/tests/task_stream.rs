//! Task streams over real loopback TCP: frames arrive whole and in order
//! from any thread, a frame larger than the socket buffers goes out through
//! the backlog, closing delivers what was sent, and a peer with a wrong
//! token, another protocol version, garbage or an absurd frame length is
//! refused with a clear error.

use std::time::Duration;

use prost::Message;
use raylet_common::auth::AuthToken;
use raylet_proto::task_stream::{self, StreamSocket, TaskReader};
use raylet_proto::v1::{TaskStreamHello, TaskStreamWelcome, WorkerEvents};
use raylet_proto::{Error, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod support;

use support::batch;

const PATIENCE: Duration = Duration::from_secs(2);

/// A listener and the result of admitting the first stream opened on it.
async fn listen(token: &AuthToken) -> (String, tokio::task::JoinHandle<raylet_proto::Result<TaskReader>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let token = token.clone();
    let accepted = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (tasks, _results) = task_stream::accept(StreamSocket::Tcp(socket), &token).await?;
        Ok(tasks)
    });
    (address, accepted)
}

async fn raw_frame(socket: &mut TcpStream, message: &impl Message) {
    let bytes = message.encode_to_vec();
    socket.write_all(&(bytes.len() as u32).to_be_bytes()).await.unwrap();
    socket.write_all(&bytes).await.unwrap();
}

async fn read_welcome(socket: &mut TcpStream) -> TaskStreamWelcome {
    let length = socket.read_u32().await.unwrap() as usize;
    let mut bytes = vec![0; length];
    socket.read_exact(&mut bytes).await.unwrap();
    TaskStreamWelcome::decode(&bytes[..]).unwrap()
}

#[tokio::test]
async fn frames_from_plain_threads_arrive_whole_and_in_order_and_closing_delivers_them() {
    let token = AuthToken::generate();
    let (address, accepted) = listen(&token).await;
    let (tasks, _events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
    let mut reader = accepted.await.unwrap().unwrap();
    let sending = std::thread::spawn(move || {
        for index in 0..1000 {
            let payload = if index == 500 { 32 << 20 } else { 16 };
            tasks.send(&batch(&format!("task {index}"), payload)).unwrap();
        }
    });
    for index in 0..1000 {
        let received = reader.message().await.unwrap().expect("a frame");
        assert_eq!(received.tasks[0].function, format!("task {index}"));
        let expected = if index == 500 { 32 << 20 } else { 16 };
        assert_eq!(received.tasks[0].task_id.len(), expected);
    }
    sending.join().unwrap();
    assert!(
        reader.message().await.unwrap().is_none(),
        "the stream ends once its sender is gone"
    );
}

#[tokio::test]
async fn results_come_back_on_the_same_stream() {
    let token = AuthToken::generate();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let worker_token = token.clone();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (mut tasks, results) = task_stream::accept(StreamSocket::Tcp(socket), &worker_token)
            .await
            .unwrap();
        while let Some(batch) = tasks.message().await.unwrap() {
            let echoed = WorkerEvents {
                logs: vec![raylet_proto::v1::LogLine {
                    function: batch.tasks[0].function.clone(),
                    ..Default::default()
                }],
                ..WorkerEvents::default()
            };
            results.send(&echoed).unwrap();
        }
    });
    let (tasks, mut events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
    tasks.send(&batch("echo me", 16)).unwrap();
    let echoed = events.message().await.unwrap().unwrap();
    assert_eq!(echoed.logs[0].function, "echo me");
}

#[tokio::test]
async fn a_wrong_token_is_refused_on_both_sides_without_showing_either() {
    let token = AuthToken::generate();
    let wrong = AuthToken::generate();
    let (address, accepted) = listen(&token).await;
    let refused = task_stream::open(&address, &wrong, PATIENCE).await.err().unwrap();
    assert!(matches!(refused, Error::Unauthenticated(_)), "{refused}");
    assert!(refused.to_string().contains("token is wrong"), "{refused}");
    let text = refused.to_string();
    assert!(!text.contains(token.expose()) && !text.contains(wrong.expose()));
    let error = accepted.await.unwrap().err().unwrap();
    assert!(matches!(error, Error::Unauthenticated(_)), "{error}");
}

#[tokio::test]
async fn another_protocol_version_is_refused_naming_both() {
    let token = AuthToken::generate();
    let (address, accepted) = listen(&token).await;
    let mut socket = TcpStream::connect(&address).await.unwrap();
    let hello = TaskStreamHello {
        token: token.expose().to_string(),
        protocol_version: PROTOCOL_VERSION + 98,
    };
    raw_frame(&mut socket, &hello).await;
    let welcome = read_welcome(&mut socket).await;
    assert_ne!(welcome.refusal_code, 0);
    let other = (PROTOCOL_VERSION + 98).to_string();
    assert!(welcome.refusal.contains(&other), "{}", welcome.refusal);
    assert!(
        welcome.refusal.contains(&format!("version {PROTOCOL_VERSION}")),
        "{}",
        welcome.refusal
    );
    assert!(accepted.await.unwrap().is_err());
}

#[tokio::test]
async fn garbage_and_absurd_lengths_are_refused_and_the_next_stream_is_served() {
    let token = AuthToken::generate();
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xff, 0xff, 0xff, 0xff, 1, 2, 3][..],
        &[0, 0, 0, 3, 0xff, 0xff, 0xff][..],
    ] {
        let (address, accepted) = listen(&token).await;
        let mut socket = TcpStream::connect(&address).await.unwrap();
        socket.write_all(garbage).await.unwrap();
        let error = tokio::time::timeout(PATIENCE, accepted)
            .await
            .expect("garbage is refused at once, not waited on")
            .unwrap()
            .err()
            .unwrap();
        assert!(matches!(error, Error::InvalidArgument(_)), "{garbage:?}: {error}");
    }
    let (address, accepted) = listen(&token).await;
    let mut socket = TcpStream::connect(&address).await.unwrap();
    socket.write_all(&[0x7f, 0xff, 0xff, 0xff]).await.unwrap();
    let error = accepted.await.unwrap().err().unwrap().to_string();
    assert!(error.contains("over the limit"), "{error}");

    let (address, accepted) = listen(&token).await;
    let (tasks, _events) = task_stream::open(&address, &token, PATIENCE).await.unwrap();
    tasks.send(&batch("after garbage", 16)).unwrap();
    let mut reader = accepted.await.unwrap().unwrap();
    assert_eq!(
        reader.message().await.unwrap().unwrap().tasks[0].function,
        "after garbage"
    );
}

#[tokio::test]
async fn opening_a_stream_to_nothing_fails_in_bounded_time() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let started = std::time::Instant::now();
    let error = task_stream::open(&address, &AuthToken::generate(), Duration::from_millis(300))
        .await
        .err()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(error.to_string().contains("could not reach"), "{error}");
}
