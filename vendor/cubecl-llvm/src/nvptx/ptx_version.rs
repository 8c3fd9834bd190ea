//! The newest PTX ISA version a CUDA driver loads.

use core::fmt;

/// A PTX ISA version, spelled as the NVPTX target feature does: 8.4 is `84`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PtxVersion(u32);

impl PtxVersion {
    /// The newest version a driver of CUDA `driver` loads, as
    /// `cuDriverGetVersion` reports it (12.4 is `12040`); `None` before
    /// CUDA 11.0.
    pub fn for_driver(driver: i32) -> Option<Self> {
        let (major, minor) = (driver / 1000, (driver % 1000) / 10);
        let isa = match (major, minor) {
            (..=10, _) => return None,
            (11, minor) => 70 + minor.min(8),
            (12, 0..=5) => 80 + minor,
            (12, 6 | 7) => 85,
            (12, 8) => 87,
            (12, _) => 88,
            (13, minor) => 90 + minor.min(3),
            _ => 93,
        };
        Some(Self(isa as u32))
    }
}

impl fmt::Display for PtxVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ptx{}", self.0)
    }
}

