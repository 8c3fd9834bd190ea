//! `raylet start --spill-to s3://bucket/prefix`: the node's object store
//! spills into a bucket of object storage, under `<prefix>/<node id>/`,
//! through raylet-storage (credentials and endpoint from the usual `AWS_*`
//! variables). The bucket is written and read once at start, so that a
//! wrong URL or credentials stop `raylet start` instead of the first spill.

use std::io;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use raylet_object_store::SpillTarget;
use raylet_object_store::segment::Segment;
use raylet_proto::NodeId;
use raylet_storage::{Storage, StorageOptions};

/// Spilled objects as files of a bucket.
#[derive(Debug)]
pub struct BucketSpill(Storage);

/// The file written and read back at start.
const PROBE: &str = ".raylet-spill-probe";

impl BucketSpill {
    /// The spill target of node `node` under `url`, checked by a write and
    /// a read.
    pub fn open(url: &str, node: NodeId) -> anyhow::Result<Arc<dyn SpillTarget>> {
        if !raylet_storage::is_url(url) {
            anyhow::bail!(
                "--spill-to {url}: give a bucket URL such as s3://bucket/prefix (--spill-dir takes a directory)"
            );
        }
        let storage = Storage::open(url, &StorageOptions::new())
            .with_context(|| format!("--spill-to {url}"))?
            .child(&node.to_string());
        storage
            .write(PROBE, Bytes::from_static(b"raylet"))
            .and_then(|()| storage.read(PROBE))
            .and_then(|_| storage.delete(PROBE))
            .with_context(|| format!("--spill-to {url}: the bucket cannot be written and read"))?;
        Ok(Arc::new(BucketSpill(storage)))
    }
}

fn io_error(error: raylet_storage::StorageError) -> io::Error {
    io::Error::other(error.to_string())
}

impl SpillTarget for BucketSpill {
    fn write(&self, name: &str, segment: &Segment) -> io::Result<()> {
        self.0.write(name, Bytes::from(segment.contents()?)).map_err(io_error)
    }

    fn restore(&self, name: &str, segment: &str) -> io::Result<Segment> {
        let bytes = self.0.read(name).map_err(io_error)?;
        Segment::sealed_with(segment, &bytes)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.0.delete(name).map_err(io_error)
    }

    fn location_of(&self, name: &str) -> String {
        self.0.location_of(name)
    }

    fn remove_all(&self) -> io::Result<()> {
        for (file, _) in self.0.list().map_err(io_error)? {
            self.0.delete(&file).map_err(io_error)?;
        }
        Ok(())
    }
}
