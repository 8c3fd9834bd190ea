//! raylet's stand-in for `cubecl-llvm` 0.11.3: the items `cubecl-cuda` names,
//! without LLVM.
//!
//! `cubecl-cuda` 0.11.3 depends on `cubecl-llvm` whatever its features, and
//! the real crate's build script downloads an LLVM 23 bundle, which fails on
//! a machine without internet. With cubecl's `cuda-cpp` feature (which
//! raylet-train's `cuda` feature turns on) every kernel is CUDA C++ compiled
//! by NVRTC and nothing calls into LLVM at run time, but `cubecl-cuda` still
//! names these types. This crate provides them and refuses, with an error
//! that says why, the one thing it cannot do: compile a kernel through LLVM.

mod compiler;
pub mod nvptx;
pub mod shared;

pub use compiler::{LlvmTarget, NvptxModule, PlironArtifact, PlironCompiler, PlironOptions};
