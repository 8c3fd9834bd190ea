//! Where a node's store spills objects when its memory is short: a local
//! directory ([`SpillDirectory`]), or another [`SpillTarget`] the node is
//! given, such as a bucket of object storage (`raylet start --spill-to
//! s3://bucket/prefix`). A spilled object is one file named by its id.

use std::fmt::Debug;
use std::io;
use std::path::PathBuf;

use crate::segment::Segment;

/// A place that holds spilled objects.
pub trait SpillTarget: Debug + Send + Sync {
    /// Writes `segment`'s bytes as file `name`.
    fn write(&self, name: &str, segment: &Segment) -> io::Result<()>;
    /// Reads file `name` back into a new sealed segment called `segment`.
    fn restore(&self, name: &str, segment: &str) -> io::Result<Segment>;
    /// Removes file `name`.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Where file `name` is, for messages.
    fn location_of(&self, name: &str) -> String;
    /// Removes every spilled object left, when the node stops.
    fn remove_all(&self) -> io::Result<()>;
}

/// Spilled objects as files of a local directory, made when first needed.
#[derive(Debug)]
pub struct SpillDirectory(pub PathBuf);

impl SpillTarget for SpillDirectory {
    fn write(&self, name: &str, segment: &Segment) -> io::Result<()> {
        std::fs::create_dir_all(&self.0)?;
        segment.spill_to(&self.0.join(name))
    }

    fn restore(&self, name: &str, segment: &str) -> io::Result<Segment> {
        Segment::restore(segment, &self.0.join(name))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.0.join(name))
    }

    fn location_of(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    fn remove_all(&self) -> io::Result<()> {
        match std::fs::remove_dir_all(&self.0) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}
