//! Compiles the `.proto` files with the protoc that ships in `protoc-bin-vendored`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/raylet/v1/actor.proto",
        "proto/raylet/v1/common.proto",
        "proto/raylet/v1/head.proto",
        "proto/raylet/v1/job.proto",
        "proto/raylet/v1/kv.proto",
        "proto/raylet/v1/node_manager.proto",
        "proto/raylet/v1/object_store.proto",
        "proto/raylet/v1/owner.proto",
        "proto/raylet/v1/placement_group.proto",
        "proto/raylet/v1/task_event.proto",
        "proto/raylet/v1/worker.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("raylet_descriptors.bin");
    config.file_descriptor_set_path(descriptors);
    config.bytes([
        ".raylet.v1.EncodedValue.data",
        ".raylet.v1.TaskArg.value",
        ".raylet.v1.ObjectChunk.data",
        ".raylet.v1.BlobChunk.data",
        ".raylet.v1.JobLogChunk.data",
    ]);
    tonic_prost_build::configure().compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
