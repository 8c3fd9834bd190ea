//! Every gRPC method's request, and every task stream frame, decoded from
//! bytes as its server decodes it, then put through the conversions of this
//! crate that the servers call (ids, resource sets, scheduling, labels, blob
//! refs, bundles). A server's own checks (a field it requires, say) stay in
//! the server and are not copied here. The `decode_requests` fuzz target
//! drives it, and a test keeps [`METHODS`] complete against the compiled
//! `.proto` descriptors.

use prost::Message;

use crate::blob::check_ref;
use crate::placement_group::check_bundles;
use crate::scheduling::labels_from_proto;
use crate::v1;
use crate::{
    ActorId, Error, JobId, NodeId, ObjectId, PlacementGroupId, PlacementStrategy, ResourceSet, Result, Scheduling,
    TaskId, WorkerId,
};

/// A request message that some server decodes: a gRPC method's input, or a
/// frame of a task stream.
pub struct Method {
    /// `/raylet.v1.Service/Method`, or `task stream: ...` for a frame.
    pub path: &'static str,
    /// The full name of the message, e.g. `raylet.v1.RegisterNodeRequest`.
    pub input: &'static str,
    decode: fn(&[u8]) -> Result<Decoded>,
}

impl Method {
    /// Decodes `bytes` as this method's input and runs the server's
    /// conversions on it.
    pub fn decode(&self, bytes: &[u8]) -> Result<Decoded> {
        (self.decode)(bytes)
    }
}

/// A request that decoded and converted.
#[derive(Debug)]
pub struct Decoded {
    /// The message encoded again.
    pub reencoded: Vec<u8>,
    /// Whether decoding `reencoded` gives back the same message.
    pub round_trips: bool,
}

macro_rules! methods {
    ($($path:expr => $input:ident),* $(,)?) => {
        &[$(Method {
            path: $path,
            input: concat!("raylet.v1.", stringify!($input)),
            decode: decode_as::<v1::$input>,
        }),*]
    };
}

/// Every gRPC method of every raylet service, by its input message. For a
/// client-streaming method the input is one message of the stream.
pub const METHODS: &[Method] = methods![
    "/raylet.v1.HeadService/RegisterNode" => RegisterNodeRequest,
    "/raylet.v1.HeadService/Heartbeat" => HeartbeatRequest,
    "/raylet.v1.HeadService/UnregisterNode" => UnregisterNodeRequest,
    "/raylet.v1.HeadService/GetClusterStatus" => GetClusterStatusRequest,
    "/raylet.v1.HeadService/WatchNodeDeaths" => WatchNodeDeathsRequest,
    "/raylet.v1.HeadService/DrainNode" => DrainNodeRequest,
    "/raylet.v1.ActorService/CreateActor" => CreateActorRequest,
    "/raylet.v1.ActorService/WatchActors" => WatchActorRequest,
    "/raylet.v1.ActorService/GetNamedActor" => GetNamedActorRequest,
    "/raylet.v1.ActorService/KillActor" => KillActorRequest,
    "/raylet.v1.ActorService/ListActors" => ListActorsRequest,
    "/raylet.v1.ActorService/OwnerSession" => OwnerSessionMessage,
    "/raylet.v1.JobService/MissingBlobs" => MissingBlobsRequest,
    "/raylet.v1.JobService/UploadBlob" => BlobChunk,
    "/raylet.v1.JobService/FetchBlob" => FetchBlobRequest,
    "/raylet.v1.JobService/SubmitJob" => SubmitJobRequest,
    "/raylet.v1.JobService/WatchJob" => WatchJobRequest,
    "/raylet.v1.JobService/ListJobs" => ListJobsRequest,
    "/raylet.v1.JobService/StopJob" => StopJobRequest,
    "/raylet.v1.JobService/ReadJobLogs" => ReadJobLogsRequest,
    "/raylet.v1.JobService/DeleteJob" => DeleteJobRequest,
    "/raylet.v1.KvService/KvPut" => KvPutRequest,
    "/raylet.v1.KvService/KvGet" => KvGetRequest,
    "/raylet.v1.KvService/KvDelete" => KvDeleteRequest,
    "/raylet.v1.KvService/KvKeys" => KvKeysRequest,
    "/raylet.v1.NodeManagerService/LeaseSession" => LeaseSessionRequest,
    "/raylet.v1.NodeManagerService/WorkerSession" => WorkerSessionMessage,
    "/raylet.v1.NodeManagerService/GetWorkerExit" => GetWorkerExitRequest,
    "/raylet.v1.NodeManagerService/ApplyBundleOps" => BundleOpsRequest,
    "/raylet.v1.NodeManagerService/RunJobDriver" => RunJobDriverRequest,
    "/raylet.v1.NodeManagerService/AttachJobDriver" => AttachJobDriverRequest,
    "/raylet.v1.NodeManagerService/StopJobDriver" => StopJobDriverRequest,
    "/raylet.v1.NodeManagerService/ReadWorkerLog" => ReadWorkerLogRequest,
    "/raylet.v1.NodeManagerService/DumpWorkerStacks" => DumpWorkerStacksRequest,
    "/raylet.v1.ObjectStoreService/Session" => StoreSessionMessage,
    "/raylet.v1.ObjectStoreService/CreateObject" => CreateObjectRequest,
    "/raylet.v1.ObjectStoreService/SealObject" => SealObjectRequest,
    "/raylet.v1.ObjectStoreService/GetObject" => GetStoredObjectRequest,
    "/raylet.v1.ObjectStoreService/DeleteObjects" => DeleteObjectsRequest,
    "/raylet.v1.ObjectStoreService/GetStoreStats" => GetStoreStatsRequest,
    "/raylet.v1.ObjectStoreService/ReadChunks" => ReadChunksRequest,
    "/raylet.v1.ObjectStoreService/OpenTransfer" => ReadChunksRequest,
    "/raylet.v1.ObjectStoreService/PullObject" => PullObjectRequest,
    "/raylet.v1.OwnerService/GetObject" => GetObjectRequest,
    "/raylet.v1.OwnerService/UpdateBorrowers" => UpdateBorrowersRequest,
    "/raylet.v1.OwnerService/DescribeObjects" => DescribeObjectsRequest,
    "/raylet.v1.OwnerService/AddCopies" => AddCopiesRequest,
    "/raylet.v1.PlacementGroupService/PlacementGroupSession" => PlacementGroupCall,
    "/raylet.v1.PlacementGroupService/WaitPlacementGroup" => WaitPlacementGroupRequest,
    "/raylet.v1.PlacementGroupService/ListPlacementGroups" => ListPlacementGroupsRequest,
    "/raylet.v1.TaskEventService/ReportTaskEvents" => ReportTaskEventsRequest,
    "/raylet.v1.TaskEventService/ListTasks" => ListTasksRequest,
    "/raylet.v1.TaskEventService/ListSpans" => ListSpansRequest,
];

/// The frames of a task stream (see [`crate::task_stream`]), which a worker
/// and an owner decode off their own TCP connection, and those of the
/// same-node calls ([`crate::same_node_calls`]) that a store answers.
pub const TASK_STREAM_FRAMES: &[Method] = methods![
    "task stream: the owner's hello" => TaskStreamHello,
    "task stream: the worker's welcome" => TaskStreamWelcome,
    "task stream: tasks to a worker" => TaskBatch,
    "task stream: a worker's results" => WorkerEvents,
    "same-node calls: a store call" => StoreCall,
];

/// The method or frame whose input message is `input` (a full name such as
/// `raylet.v1.HeartbeatRequest`).
pub fn by_input(input: &str) -> Option<&'static Method> {
    METHODS
        .iter()
        .chain(TASK_STREAM_FRAMES)
        .find(|method| method.input == input)
}

/// Decodes `bytes` as the message named `input` and runs the server's
/// conversions on it.
pub fn decode_request(input: &str, bytes: &[u8]) -> Result<Decoded> {
    by_input(input)
        .ok_or_else(|| Error::NotFound(format!("no raylet method takes a {input}")))?
        .decode(bytes)
}

fn decode_as<T: Message + Default + PartialEq + Convert>(bytes: &[u8]) -> Result<Decoded> {
    let message = T::decode(bytes).map_err(|e| {
        Error::InvalidArgument(format!(
            "{} bytes are not a {}: {e}",
            bytes.len(),
            std::any::type_name::<T>()
        ))
    })?;
    message.convert()?;
    let reencoded = message.encode_to_vec();
    let round_trips = match T::decode(reencoded.as_slice()) {
        Ok(again) if equals_itself(&message) => again == message,
        Ok(again) => again.encoded_len() == reencoded.len(),
        Err(_) => false,
    };
    Ok(Decoded { reencoded, round_trips })
}

/// Whether `message` equals itself: one with a NaN does not, and then only
/// its length is compared after a round trip.
#[expect(clippy::eq_op, reason = "a NaN field makes a message unequal to itself")]
fn equals_itself<T: PartialEq>(message: &T) -> bool {
    message == message
}

/// The conversions a server runs on a decoded message, as far as they are
/// this crate's.
trait Convert {
    fn convert(&self) -> Result<()>;
}

/// Messages that servers take as they are.
macro_rules! taken_as_is {
    ($($message:ident),* $(,)?) => {
        $(impl Convert for v1::$message {
            fn convert(&self) -> Result<()> {
                Ok(())
            }
        })*
    };
}

taken_as_is!(
    GetClusterStatusRequest,
    WatchNodeDeathsRequest,
    MissingBlobsRequest,
    FetchBlobRequest,
    GetNamedActorRequest,
    ListActorsRequest,
    OwnerSessionMessage,
    ListJobsRequest,
    KvPutRequest,
    KvGetRequest,
    KvDeleteRequest,
    KvKeysRequest,
    GetStoreStatsRequest,
    ListPlacementGroupsRequest,
    TaskStreamHello,
    TaskStreamWelcome,
    // The head keeps task events and lists them by their raw ids.
    ReportTaskEventsRequest,
    ListTasksRequest,
    ListSpansRequest,
);

fn resources(map: Option<&v1::ResourceMap>) -> Result<ResourceSet> {
    ResourceSet::from_proto(map.unwrap_or(&v1::ResourceMap::default()))
}

fn job_resources(spec: Option<&v1::JobSpec>) -> Result<()> {
    resources(spec.and_then(|spec| spec.resources.as_ref())).map(drop)
}

/// A list of object ids, such as a delete or a describe carries.
fn object_ids(ids: &[Vec<u8>]) -> Result<()> {
    ids.iter().try_for_each(|id| ObjectId::from_wire(id).map(drop))
}

impl Convert for v1::RegisterNodeRequest {
    fn convert(&self) -> Result<()> {
        NodeId::from_wire(&self.node_id)?;
        resources(self.total.as_ref())?;
        labels_from_proto(&self.labels)?;
        Ok(())
    }
}

impl Convert for v1::HeartbeatRequest {
    fn convert(&self) -> Result<()> {
        NodeId::from_wire(&self.node_id)?;
        resources(self.total.as_ref())?;
        resources(self.available.as_ref())?;
        for demand in &self.demands {
            resources(demand.shape.as_ref())?;
        }
        Ok(())
    }
}

impl Convert for v1::UnregisterNodeRequest {
    fn convert(&self) -> Result<()> {
        NodeId::from_wire(&self.node_id).map(drop)
    }
}

impl Convert for v1::DrainNodeRequest {
    fn convert(&self) -> Result<()> {
        NodeId::from_wire(&self.node_id).map(drop)
    }
}

/// The head keeps the constructor's arguments as they are: the worker that
/// hosts the actor reads them, and fails the creation on a malformed one.
impl Convert for v1::CreateActorRequest {
    fn convert(&self) -> Result<()> {
        ActorId::from_wire(&self.actor_id)?;
        resources(self.placement.as_ref())?;
        resources(self.running.as_ref())?;
        Scheduling::from_proto(self.strategy.as_ref()).map(drop)
    }
}

impl Convert for v1::WatchActorRequest {
    fn convert(&self) -> Result<()> {
        ActorId::from_wire(&self.actor_id).map(drop)
    }
}

impl Convert for v1::KillActorRequest {
    fn convert(&self) -> Result<()> {
        ActorId::from_wire(&self.actor_id).map(drop)
    }
}

impl Convert for v1::BlobChunk {
    fn convert(&self) -> Result<()> {
        self.blob.as_ref().map_or(Ok(()), check_ref)
    }
}

impl Convert for v1::SubmitJobRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id)?;
        if let Some(spec) = &self.spec {
            let files = spec.files.iter().filter_map(|file| file.blob.as_ref());
            spec.binary.iter().chain(files).try_for_each(check_ref)?;
        }
        job_resources(self.spec.as_ref())
    }
}

impl Convert for v1::WatchJobRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id).map(drop)
    }
}

impl Convert for v1::StopJobRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id).map(drop)
    }
}

impl Convert for v1::ReadJobLogsRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id).map(drop)
    }
}

impl Convert for v1::DeleteJobRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id).map(drop)
    }
}

/// A node manager refuses a lease request whose resources or strategy do
/// not decode, and ignores returns, adoptions and resizes of malformed ids
/// and malformed backlog reports.
impl Convert for v1::LeaseSessionRequest {
    fn convert(&self) -> Result<()> {
        use v1::lease_session_request::Kind;
        match &self.kind {
            Some(Kind::Request(request)) => {
                resources(request.resources.as_ref())?;
                Scheduling::from_proto(request.strategy.as_ref())?;
            }
            Some(Kind::ReturnLease(returned)) => {
                let _ = WorkerId::from_wire(&returned.worker_id);
            }
            Some(Kind::Adopt(adopt)) => {
                let _ = WorkerId::from_wire(&adopt.worker_id);
            }
            Some(Kind::Resize(resize)) => {
                let _ = WorkerId::from_wire(&resize.worker_id);
                let _ = resources(resize.resources.as_ref());
            }
            Some(Kind::Backlog(report)) => {
                let _ = resources(report.resources.as_ref());
                let _ = Scheduling::from_proto(report.strategy.as_ref());
            }
            Some(Kind::Open(_) | Kind::Cancel(_)) | None => {}
        }
        Ok(())
    }
}

impl Convert for v1::WorkerSessionMessage {
    fn convert(&self) -> Result<()> {
        match &self.kind {
            Some(v1::worker_session_message::Kind::Register(register)) => {
                WorkerId::from_wire(&register.worker_id).map(drop)
            }
            _ => Ok(()),
        }
    }
}

impl Convert for v1::GetWorkerExitRequest {
    fn convert(&self) -> Result<()> {
        WorkerId::from_wire(&self.worker_id).map(drop)
    }
}

impl Convert for v1::BundleOpsRequest {
    fn convert(&self) -> Result<()> {
        for op in &self.ops {
            PlacementGroupId::from_wire(&op.placement_group_id)?;
            for bundle in &op.bundles {
                resources(bundle.resources.as_ref())?;
            }
        }
        Ok(())
    }
}

impl Convert for v1::RunJobDriverRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id)?;
        job_resources(self.spec.as_ref())
    }
}

impl Convert for v1::AttachJobDriverRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id).map(drop)
    }
}

impl Convert for v1::StopJobDriverRequest {
    fn convert(&self) -> Result<()> {
        JobId::from_wire(&self.job_id).map(drop)
    }
}

impl Convert for v1::DumpWorkerStacksRequest {
    fn convert(&self) -> Result<()> {
        Ok(())
    }
}

impl Convert for v1::ReadWorkerLogRequest {
    fn convert(&self) -> Result<()> {
        match self.worker_id.is_empty() {
            false => WorkerId::from_wire(&self.worker_id).map(drop),
            true => Ok(()),
        }
    }
}

impl Convert for v1::StoreSessionMessage {
    fn convert(&self) -> Result<()> {
        object_ids(&self.release)
    }
}

impl Convert for v1::CreateObjectRequest {
    fn convert(&self) -> Result<()> {
        ObjectId::from_wire(&self.object_id).map(drop)
    }
}

impl Convert for v1::SealObjectRequest {
    fn convert(&self) -> Result<()> {
        ObjectId::from_wire(&self.object_id).map(drop)
    }
}

impl Convert for v1::GetStoredObjectRequest {
    fn convert(&self) -> Result<()> {
        ObjectId::from_wire(&self.object_id).map(drop)
    }
}

impl Convert for v1::StoreCall {
    fn convert(&self) -> Result<()> {
        match &self.call {
            Some(v1::store_call::Call::Create(create)) => create.convert(),
            Some(v1::store_call::Call::Seal(seal)) => seal.convert(),
            Some(v1::store_call::Call::Get(get)) => get.convert(),
            Some(v1::store_call::Call::Delete(delete)) => delete.convert(),
            None => Err(Error::InvalidArgument("an empty store call".into())),
        }
    }
}

impl Convert for v1::DeleteObjectsRequest {
    fn convert(&self) -> Result<()> {
        object_ids(&self.object_ids)
    }
}

impl Convert for v1::ReadChunksRequest {
    fn convert(&self) -> Result<()> {
        ObjectId::from_wire(&self.object_id).map(drop)
    }
}

impl Convert for v1::PullObjectRequest {
    fn convert(&self) -> Result<()> {
        ObjectId::from_wire(&self.object_id).map(drop)
    }
}

impl Convert for v1::GetObjectRequest {
    fn convert(&self) -> Result<()> {
        ObjectId::from_wire(&self.object_id).map(drop)
    }
}

impl Convert for v1::UpdateBorrowersRequest {
    fn convert(&self) -> Result<()> {
        self.changes
            .iter()
            .try_for_each(|change| ObjectId::from_wire(&change.object_id).map(drop))
    }
}

impl Convert for v1::DescribeObjectsRequest {
    fn convert(&self) -> Result<()> {
        object_ids(&self.object_ids)
    }
}

impl Convert for v1::AddCopiesRequest {
    fn convert(&self) -> Result<()> {
        self.copies
            .iter()
            .try_for_each(|copy| ObjectId::from_wire(&copy.object_id).map(drop))
    }
}

impl Convert for v1::PlacementGroupCall {
    fn convert(&self) -> Result<()> {
        use v1::placement_group_call::Kind;
        match &self.kind {
            Some(Kind::Create(create)) => {
                PlacementGroupId::from_wire(&create.placement_group_id)?;
                let bundles = create
                    .bundles
                    .iter()
                    .map(ResourceSet::from_proto)
                    .collect::<Result<Vec<_>>>()?;
                check_bundles(&bundles)?;
                PlacementStrategy::from_proto(create.strategy());
                Ok(())
            }
            Some(Kind::Remove(remove)) => PlacementGroupId::from_wire(&remove.placement_group_id).map(drop),
            None => Ok(()),
        }
    }
}

impl Convert for v1::WaitPlacementGroupRequest {
    fn convert(&self) -> Result<()> {
        PlacementGroupId::from_wire(&self.placement_group_id).map(drop)
    }
}

/// A worker ignores cancels of malformed ids and fails alone a task whose id
/// or argument is malformed: a batch always decodes.
impl Convert for v1::TaskBatch {
    fn convert(&self) -> Result<()> {
        for task in &self.tasks {
            let _ = TaskId::from_wire(&task.task_id);
            let _ = task.args.iter().try_for_each(task_arg);
        }
        for cancel in &self.cancel {
            let _ = TaskId::from_wire(&cancel.task_id);
        }
        for ack in &self.acks {
            let _ = TaskId::from_wire(&ack.task_id);
        }
        Ok(())
    }
}

/// An owner skips results of malformed task ids, and drops the malformed
/// references inside a value and the malformed node of a failure.
impl Convert for v1::WorkerEvents {
    fn convert(&self) -> Result<()> {
        for result in &self.results {
            let _ = TaskId::from_wire(&result.task_id);
            object_outcome(result.outcome.as_ref());
            result.more_returns.iter().for_each(|more| object_outcome(Some(more)));
        }
        for item in &self.items {
            let _ = TaskId::from_wire(&item.task_id);
            object_outcome(item.item.as_ref());
        }
        Ok(())
    }
}

fn object_outcome(outcome: Option<&v1::ObjectOutcome>) {
    match outcome.and_then(|outcome| outcome.outcome.as_ref()) {
        Some(v1::object_outcome::Outcome::Value(value)) => {
            for contained in &value.contained {
                let _ = ObjectId::from_wire(&contained.object_id);
            }
        }
        Some(v1::object_outcome::Outcome::Failure(failure)) => {
            let _ = NodeId::from_wire(&failure.node_id);
        }
        None => {}
    }
}

fn task_arg(arg: &v1::TaskArg) -> Result<()> {
    match &arg.kind {
        Some(v1::task_arg::Kind::ObjectRef(object)) => ObjectId::from_wire(&object.object_id).map(drop),
        Some(v1::task_arg::Kind::Stored(stored)) => ObjectId::from_wire(&stored.object_id).map(drop),
        Some(v1::task_arg::Kind::Value(_)) | None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The parts of `google.protobuf.FileDescriptorSet` that name each
    /// method's input; the rest of each message is skipped as unknown.
    #[derive(Clone, PartialEq, prost::Message)]
    struct FileDescriptorSet {
        #[prost(message, repeated, tag = "1")]
        file: Vec<FileDescriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct FileDescriptor {
        #[prost(string, tag = "2")]
        package: String,
        #[prost(message, repeated, tag = "6")]
        service: Vec<ServiceDescriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct ServiceDescriptor {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, repeated, tag = "2")]
        method: Vec<MethodDescriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct MethodDescriptor {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(string, tag = "2")]
        input_type: String,
    }

    /// Every method of the compiled `.proto` files, as (path, input type).
    fn described_methods() -> BTreeSet<(String, String)> {
        let set = FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).unwrap();
        let mut methods = BTreeSet::new();
        for file in set.file {
            for service in file.service {
                for method in service.method {
                    let path = format!("/{}.{}/{}", file.package, service.name, method.name);
                    let input = method.input_type.trim_start_matches('.').to_string();
                    methods.insert((path, input));
                }
            }
        }
        methods
    }

    #[test]
    fn every_method_of_every_service_is_decoded_by_its_input_type() {
        let described = described_methods();
        assert_eq!(described.len(), 53, "{described:#?}");
        let listed: BTreeSet<(String, String)> = METHODS
            .iter()
            .map(|method| (method.path.to_string(), method.input.to_string()))
            .collect();
        assert_eq!(listed.len(), METHODS.len(), "a method is listed twice");
        let missing: Vec<_> = described.difference(&listed).collect();
        let stale: Vec<_> = listed.difference(&described).collect();
        assert!(
            missing.is_empty(),
            "methods that request_decoding does not decode: {missing:?}"
        );
        assert!(stale.is_empty(), "listed methods that the .proto files lack: {stale:?}");
    }

    #[test]
    fn empty_requests_round_trip_and_a_nan_is_compared_by_length() {
        for method in METHODS.iter().chain(TASK_STREAM_FRAMES) {
            let result = method.decode(&[]);
            if let Ok(decoded) = result {
                assert!(decoded.round_trips, "{}", method.path);
            }
        }
        let heartbeat = v1::HeartbeatRequest {
            node_id: NodeId::random().as_bytes().to_vec(),
            stats: Some(v1::NodeStats {
                cpu_percent: f64::NAN,
                ..Default::default()
            }),
            ..Default::default()
        };
        let decoded = decode_request("raylet.v1.HeartbeatRequest", &heartbeat.encode_to_vec()).unwrap();
        assert!(decoded.round_trips, "a NaN is compared by length");
    }

    #[test]
    fn malformed_requests_are_errors_that_name_what_is_wrong() {
        let short_id = v1::WatchActorRequest {
            actor_id: vec![1, 2, 3],
        };
        let error = decode_request("raylet.v1.WatchActorRequest", &short_id.encode_to_vec()).unwrap_err();
        assert!(error.to_string().contains("ActorId must be 16 bytes"), "{error}");
        let negative = v1::RegisterNodeRequest {
            node_id: NodeId::random().as_bytes().to_vec(),
            total: Some(v1::ResourceMap {
                amounts: [("CPU".to_string(), -1)].into(),
            }),
            ..Default::default()
        };
        let error = decode_request("raylet.v1.RegisterNodeRequest", &negative.encode_to_vec()).unwrap_err();
        assert!(error.to_string().contains(">= 0"), "{error}");
        let error = decode_request("raylet.v1.KvGetRequest", &[0xff, 0xff]).unwrap_err();
        assert!(error.to_string().contains("are not a"), "{error}");
        assert!(matches!(
            decode_request("raylet.v1.NoSuchRequest", &[]),
            Err(Error::NotFound(_))
        ));
    }
}
