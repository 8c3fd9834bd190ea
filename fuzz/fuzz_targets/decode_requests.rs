//! Decodes arbitrary bytes as the request of a gRPC method (or a task stream
//! frame) picked by the first byte, with the conversions its server runs.
//! A request that is accepted must encode to a message that decodes back to
//! itself and is accepted again; where a server's fuller conversion lives in
//! the head or the cluster status (actor specs, heartbeat demands, task event reports)
//! it runs too, and what it accepts this crate's checks accept as well.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use raylet_cluster_status::ResourceDemand;
use raylet_head::actors::ActorSpec;
use raylet_head::tasks::TaskTable;
use raylet_proto::request_decoding::{METHODS, Method, TASK_STREAM_FRAMES};
use raylet_proto::v1;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let count = METHODS.len() + TASK_STREAM_FRAMES.len();
    let index = usize::from(pick) % count;
    let method = match METHODS.get(index) {
        Some(method) => method,
        None => &TASK_STREAM_FRAMES[index - METHODS.len()],
    };
    let accepted = method.decode(bytes);
    if let Ok(decoded) = &accepted {
        assert!(decoded.round_trips, "{} does not survive re-encoding", method.path);
        let again = method
            .decode(&decoded.reencoded)
            .unwrap_or_else(|e| panic!("{} re-encoded is refused: {e}", method.path));
        assert_eq!(again.reencoded.len(), decoded.reencoded.len(), "{}", method.path);
    }
    scheduler_conversions(method, bytes, accepted.is_ok());
});

/// The scheduler's own conversions of the requests that have one.
fn scheduler_conversions(method: &Method, bytes: &[u8], accepted: bool) {
    match method.input {
        "raylet.v1.CreateActorRequest" => {
            let Ok(request) = v1::CreateActorRequest::decode(bytes) else {
                return;
            };
            let Ok(spec) = ActorSpec::from_request(request) else {
                return;
            };
            assert!(accepted, "the head takes an actor that request_decoding refuses");
            let wire = spec.to_request();
            let again = ActorSpec::from_request(wire.clone()).expect("an actor spec's own request is taken");
            assert_eq!(again.to_request(), wire);
        }
        "raylet.v1.HeartbeatRequest" => {
            let Ok(request) = v1::HeartbeatRequest::decode(bytes) else {
                return;
            };
            for demand in &request.demands {
                if let Ok(decoded) = ResourceDemand::from_proto(demand) {
                    let again = ResourceDemand::from_proto(&decoded.to_proto()).expect("a demand's own wire form");
                    assert_eq!(again, decoded);
                }
            }
        }
        "raylet.v1.ReportTaskEventsRequest" => {
            let Ok(request) = v1::ReportTaskEventsRequest::decode(bytes) else {
                return;
            };
            let reported = request.tasks.len();
            let mut table = TaskTable::default();
            table.report(request);
            let (records, total) = table.list(None, usize::MAX);
            assert!(total <= reported && records.len() == total, "{total} of {reported}");
            table.spans(None);
        }
        _ => {}
    }
}
