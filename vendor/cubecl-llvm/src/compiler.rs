//! The LLVM kernel compiler's types, whose `compile` always refuses.

use cubecl_core::ir::amd::GfxArch;
use cubecl_core::ir::nvidia::SmArch;
use cubecl_environment::backtrace::BackTrace;
use cubecl_runtime::compiler::{CompilationError, Compiler};
use cubecl_runtime::kernel::{BufferIOAttr, KernelDefinition};

use crate::nvptx::ptx_version::PtxVersion;

/// What the LLVM compiler would target. Only NVPTX is named by `cubecl-cuda`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    #[default]
    Nvptx,
}

/// The options `cubecl-cuda` fills in for an LLVM compilation.
#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    /// An AMD GPU's architecture; `None` for NVPTX.
    pub arch: Option<GfxArch>,
    /// The NVIDIA device's architecture.
    pub sm_arch: Option<SmArch>,
    /// The PTX version to emit.
    pub ptx_version: Option<PtxVersion>,
    /// Whether scalars travel in the kernel parameter block.
    pub grid_constants: bool,
}

/// A compiled PTX module. Never made here: the type exists because
/// `cubecl-cuda` names it.
#[derive(Clone, Debug)]
pub struct NvptxModule {
    /// NUL-terminated PTX.
    pub ptx: Vec<core::ffi::c_char>,
    /// The kernel's entry point.
    pub entrypoint: String,
    /// The IR, for logs and cache keys.
    pub ir: String,
    /// Shared memory each launch reserves, in bytes.
    pub shared_memory_size: usize,
    /// How the kernel uses each buffer, in binding order.
    pub io: Vec<BufferIOAttr>,
}

/// What a compilation yields.
#[derive(Clone, Debug)]
pub enum PlironArtifact {
    NvptxCode(NvptxModule),
}

impl core::fmt::Display for PlironArtifact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlironArtifact::NvptxCode(module) => f.write_str(&module.ir),
        }
    }
}

/// The LLVM kernel compiler, which this stand-in cannot run.
#[derive(Clone, Debug, Default)]
pub struct PlironCompiler {
    pub target: LlvmTarget,
}

/// Why [`PlironCompiler::compile`] fails, and what to do instead.
pub const NO_LLVM: &str = "this build has no LLVM (raylet replaces cubecl-llvm with a stand-in): \
     compile kernels with NVRTC by building with cubecl's `cuda-cpp` feature \
     (raylet-train's `cuda` feature does)";

impl Compiler for PlironCompiler {
    type Representation = PlironArtifact;
    type CompilationOptions = PlironOptions;

    fn compile(
        &mut self,
        _kernel: KernelDefinition,
        _options: &PlironOptions,
    ) -> Result<PlironArtifact, CompilationError> {
        Err(CompilationError::Generic {
            reason: NO_LLVM.to_string(),
            backtrace: BackTrace::capture(),
        })
    }

    fn extension(&self) -> &'static str {
        "ll"
    }

    fn lang_tag(&self) -> &'static str {
        "llvm"
    }
}
