//! Reads arbitrary bytes as a worker's side of a task stream sends them to
//! a caller (`raylet_proto::task_stream::messages_of`), cut into reads at
//! sizes the first bytes pick, as the same-node reader thread and the
//! runtime read them. Cutting never changes what is read: the same bytes
//! in one read give the same messages and the same error; what decodes
//! encodes again into frames that read back to the same messages.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use raylet_proto::task_stream::messages_of;
use raylet_proto::v1::WorkerEvents;

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, bytes)) = data.split_first() else {
        return;
    };
    let chunks = cut(bytes, usize::from(cuts % 32) + 1);
    let (messages, error) = messages_of::<WorkerEvents>(&chunks);
    let (whole, whole_error) = messages_of::<WorkerEvents>(&[bytes]);
    assert_eq!(messages, whole, "cutting the reads changed the messages");
    assert_eq!(
        error.map(|e| e.to_string()),
        whole_error.map(|e| e.to_string()),
        "cutting the reads changed the error"
    );
    let mut framed = Vec::new();
    for message in &messages {
        let encoded = message.encode_to_vec();
        framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        framed.extend_from_slice(&encoded);
    }
    let (again, again_error) = messages_of::<WorkerEvents>(&[&framed]);
    assert!(again_error.is_none(), "re-encoded frames do not read back");
    assert_eq!(again, messages);
});

/// `bytes` in reads of `size` bytes (the last one shorter).
fn cut(bytes: &[u8], size: usize) -> Vec<&[u8]> {
    bytes.chunks(size).collect()
}
