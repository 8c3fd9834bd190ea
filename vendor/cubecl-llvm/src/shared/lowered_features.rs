//! Narrowing a device's features to what the LLVM backend lowers.

use cubecl_core::ir::DeviceProperties;

/// The GPU target a device's features would be narrowed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuTarget {
    Nvptx,
}

/// Leaves `props` as they are. `cubecl-cuda` calls this only when it runs
/// the LLVM backend, and this build's LLVM backend compiles nothing (see
/// [`crate::PlironCompiler`]), so no feature needs taking away.
pub fn restrict_features(_props: &mut DeviceProperties, _target: GpuTarget) {}
