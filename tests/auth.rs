//! Every gRPC method of every raylet service, listed from the compiled
//! `.proto` descriptors (so a new one cannot be missed), refuses a call
//! without the token, with a wrong one and with another cluster's, on a
//! CLI cluster; with the right token each reaches its service.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Daemons, head_address, raylet};
use prost::Message;
use raylet::Config;
use raylet_common::auth::{AuthToken, ClientAuth, PROTOCOL_HEADER};
use raylet_proto::{FILE_DESCRIPTOR_SET, PROTOCOL_VERSION};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

/// Each service and its methods, from the descriptors.
fn every_method() -> BTreeMap<String, Vec<String>> {
    let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
    let mut services = BTreeMap::new();
    for file in set.file {
        let package = file.package().to_string();
        for service in file.service {
            let name = format!("{package}.{}", service.name());
            let methods = service.method.iter().map(|m| m.name().to_string()).collect();
            services.insert(name, methods);
        }
    }
    services
}

/// Which process serves a service: the head, a node manager, or an owner
/// (every driver and worker).
fn server_of(service: &str) -> Option<&'static str> {
    match service {
        "raylet.v1.HeadService"
        | "raylet.v1.ActorService"
        | "raylet.v1.PlacementGroupService"
        | "raylet.v1.JobService"
        | "raylet.v1.KvService"
        | "raylet.v1.TaskEventService" => Some("head"),
        "raylet.v1.NodeManagerService" | "raylet.v1.ObjectStoreService" => Some("node"),
        "raylet.v1.OwnerService" => Some("owner"),
        _ => None,
    }
}

/// The credentials a call presents.
#[derive(Clone, Copy, Debug)]
enum Presented<'a> {
    Nothing,
    Token(&'a AuthToken),
}

/// Adds the protocol version, and the token when there is one.
struct Credentials(Option<ClientAuth>);

impl Interceptor for Credentials {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match &mut self.0 {
            Some(auth) => auth.call(request),
            None => {
                let mut request = request;
                let version = AsciiMetadataValue::from(PROTOCOL_VERSION);
                request.metadata_mut().insert(PROTOCOL_HEADER, version);
                Ok(request)
            }
        }
    }
}

/// Calls `/service/method` with an empty message; returns the status code
/// (`Ok` for an answer, `DeadlineExceeded` for a stream that stays open).
async fn call(address: &str, service: &str, method: &str, presented: Presented<'_>) -> Code {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let credentials = Credentials(match presented {
        Presented::Nothing => None,
        Presented::Token(token) => Some(ClientAuth::new(token)),
    });
    let service_with_auth = tower_interceptor(channel, credentials);
    let mut grpc = tonic::client::Grpc::new(service_with_auth);
    grpc.ready().await.unwrap();
    let path = PathAndQuery::try_from(format!("/{service}/{method}")).unwrap();
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let answered = tokio::time::timeout(Duration::from_secs(2), grpc.unary(Request::new(()), path, codec)).await;
    match answered {
        Ok(Ok(_)) => Code::Ok,
        Ok(Err(status)) => status.code(),
        Err(_) => Code::DeadlineExceeded,
    }
}

fn tower_interceptor(
    channel: Channel,
    credentials: Credentials,
) -> tonic::service::interceptor::InterceptedService<Channel, Credentials> {
    tonic::service::interceptor::InterceptedService::new(channel, credentials)
}

#[test]
fn every_grpc_method_refuses_a_missing_wrong_or_foreign_token() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    let head = head_address(temp.path());
    let token = AuthToken::parse(
        std::fs::read_to_string(temp.path().join("session_latest/token"))
            .unwrap()
            .trim(),
    )
    .unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&raylet(temp.path(), &["status", "--format", "json"])).unwrap();
    let node = status["nodes"][0]["address"].as_str().unwrap().to_string();
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let block = cluster.put(&vec![1u8; 1 << 20]).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stores = runtime.block_on(raylet::collect_memory(&head, &token)).unwrap();
    let owner = stores
        .iter()
        .flat_map(|store| &store.objects)
        .find(|object| object.id == block.id())
        .map(|object| object.owner.clone())
        .unwrap();
    let addresses = BTreeMap::from([("head", head.clone()), ("node", node), ("owner", owner)]);

    let wrong = AuthToken::parse(&"0".repeat(64)).unwrap();
    let foreign = AuthToken::generate();
    let mut covered = 0;
    for (service, methods) in every_method() {
        let server = server_of(&service).unwrap_or_else(|| panic!("{service} is new: say which process serves it"));
        let address = &addresses[server];
        for method in methods {
            for presented in [Presented::Nothing, Presented::Token(&wrong), Presented::Token(&foreign)] {
                let code = runtime.block_on(call(address, &service, &method, presented));
                assert_eq!(code, Code::Unauthenticated, "{service}/{method} with {presented:?}");
            }
            let code = runtime.block_on(call(address, &service, &method, Presented::Token(&token)));
            assert!(
                !matches!(code, Code::Unauthenticated | Code::Unimplemented),
                "{service}/{method} with the right token at the {server}: {code:?}"
            );
            covered += 1;
        }
    }
    println!("{covered} gRPC methods refuse calls without the cluster's token");
    assert!(covered >= 40, "the descriptors list every method: {covered}");
    drop(block);
    cluster.shutdown().unwrap();
}
