//! `raylet start --spill-to s3://bucket/prefix` on a real S3-compatible
//! server (`s3s-fs`): objects past the store's memory spill into the
//! bucket and come back whole, the node removes what is left when it
//! stops, and a bucket the server refuses, or a directory given as the
//! URL, stops `raylet start` with a clear error.

use std::process::Command;

use crate::common;
use common::{Daemons, head_address, raylet};
use raylet::Config;
use raylet_storage::testing::S3Server;

/// The store's memory: the test puts twice as much.
const STORE_BYTES: usize = 64 << 20;
const OBJECT_BYTES: usize = 16 << 20;

fn start_head(temp: &std::path::Path, s3: &S3Server, spill_to: &str, secret: Option<&str>) -> std::process::Output {
    let mut start = Command::new(common::RAYLET);
    start
        .args(["start", "--head", "--port", "0", "--num-cpus", "1"])
        .args([
            "--object-store-memory",
            &STORE_BYTES.to_string(),
            "--spill-to",
            spill_to,
        ])
        .arg("--temp-dir")
        .arg(temp)
        .envs(s3.env());
    if let Some(secret) = secret {
        start.env("AWS_SECRET_ACCESS_KEY", secret);
    }
    start.output().unwrap()
}

#[test]
fn objects_spill_to_a_bucket_and_come_back_whole() {
    let s3 = S3Server::start();
    s3.create_bucket("spill");
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let started = start_head(temp.path(), &s3, "s3://spill/objects", None);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let cluster = raylet::init_with(Config::new().address(head_address(temp.path())).temp_dir(temp.path())).unwrap();
    let count = 2 * STORE_BYTES / OBJECT_BYTES;
    let refs: Vec<_> = (0..count)
        .map(|n| cluster.put(&vec![n as u8; OBJECT_BYTES]).unwrap())
        .collect();
    let spilled = s3.objects("spill", "objects");
    assert!(!spilled.is_empty(), "objects spilled into the bucket");
    for (n, object) in refs.iter().enumerate() {
        let value: Vec<u8> = cluster.get(object).unwrap();
        assert_eq!(value.len(), OBJECT_BYTES);
        assert!(value.iter().all(|byte| *byte == n as u8), "object {n} came back whole");
    }
    drop(refs);
    cluster.shutdown().unwrap();
    raylet(temp.path(), &["stop"]);
    assert_eq!(
        s3.objects("spill", "objects"),
        Vec::<String>::new(),
        "the stopped node left nothing"
    );
}

#[test]
fn a_bucket_the_server_refuses_or_a_directory_stops_raylet_start_with_a_clear_error() {
    let s3 = S3Server::start();
    s3.create_bucket("spill");
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let refused = start_head(temp.path(), &s3, "s3://spill/objects", Some("not-the-secret"));
    assert!(
        !refused.status.success(),
        "{}",
        String::from_utf8_lossy(&refused.stdout)
    );
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("--spill-to s3://spill/objects: the bucket cannot be written and read"),
        "{message}"
    );
    let directory = start_head(temp.path(), &s3, "/tmp/spill", None);
    let message = String::from_utf8_lossy(&directory.stderr);
    assert!(message.contains("give a bucket URL"), "{message}");
}
