//! `GET /api/jobs/{id}/logs/tail`: a job's output over a WebSocket, as
//! Ray's client follows it (`ray job submit` without `--no-wait`, `ray job
//! logs --follow`): text frames of the output from its start, then a close
//! with code 1000 once the job has ended, so that the status the client
//! asks for next is final.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use raylet::JobClient;
use raylet_proto::JobId;

use super::super::Head;
use super::{connect, head_error, request};

/// The close code of a follow that failed: the server met an error.
const SERVER_ERROR: u16 = 1011;

pub(crate) async fn follow(State(head): State<Head>, Path(id): Path<String>, upgrade: WebSocketUpgrade) -> Response {
    let job_id = request::job_id_of(&id);
    let found = async {
        let client = connect(&head).await?;
        client.info(job_id).await.map_err(|e| head_error(e, &id))?;
        Ok::<_, super::RayJobsError>(client)
    };
    match found.await {
        Ok(client) => upgrade.on_upgrade(move |socket| send_output(socket, client, job_id)),
        Err(error) => error.into_response(),
    }
}

/// Sends the job's output until it ends, then closes.
async fn send_output(mut socket: WebSocket, client: JobClient, id: JobId) {
    let (sender, mut chunks) = tokio::sync::mpsc::channel(4);
    let following = tokio::spawn(async move { client.follow(id, sender).await });
    let mut text = Utf8Text::default();
    let close = loop {
        let Some(chunk) = chunks.recv().await else {
            let rest = text.finish();
            if !rest.is_empty() && socket.send(Message::Text(rest.into())).await.is_err() {
                return;
            }
            break close_frame(1000, "the job ended".into());
        };
        let bytes = match chunk {
            Ok(bytes) => bytes,
            Err(error) => break close_frame(SERVER_ERROR, format!("following the job's output: {error}")),
        };
        let line = text.push(&bytes);
        if !line.is_empty() && socket.send(Message::Text(line.into())).await.is_err() {
            following.abort();
            return;
        }
    };
    let _ = socket.send(Message::Close(Some(close))).await;
}

fn close_frame(code: u16, reason: String) -> CloseFrame {
    // A close frame's reason is at most 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame {
        code,
        reason: reason[..end].to_string().into(),
    }
}

/// Bytes of output turned into text frames: a character split between
/// two chunks waits for its rest; bytes that are no UTF-8 become U+FFFD.
#[derive(Default)]
struct Utf8Text {
    pending: Vec<u8>,
}

impl Utf8Text {
    /// The text of `bytes` after what was pending, up to a split character.
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let whole = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..whole]).into_owned();
        self.pending.drain(..whole);
        text
    }

    /// Whatever is still pending, as text.
    fn finish(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_between_chunks_is_sent_whole() {
        let mut text = Utf8Text::default();
        let bytes = "épée\n".as_bytes();
        assert_eq!(text.push(&bytes[..1]), "");
        assert_eq!(text.push(&bytes[1..4]), "ép");
        assert_eq!(text.push(&bytes[4..]), "ée\n");
        assert_eq!(text.push(b"\xff ok"), "\u{fffd} ok");
        assert_eq!(text.push(&[0xc3]), "");
        assert_eq!(text.finish(), "\u{fffd}");
    }
}
