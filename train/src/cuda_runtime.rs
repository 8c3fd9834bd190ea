//! What a `cuda` build needs at run time (the driver's `libcuda`, NVRTC and
//! CUDA's headers), checked before a worker touches its GPU, so that a
//! missing piece is an error that names it and says how to provide it
//! instead of a panic inside cubecl.

use std::ffi::CString;
use std::path::PathBuf;

use crate::TrainError;

/// A shared library the `cuda` backend loads, by the names it tries.
struct Library {
    names: &'static [&'static str],
    /// How to provide it.
    remedy: &'static str,
}

const DRIVER: Library = Library {
    names: &["libcuda.so.1", "libcuda.so"],
    remedy: "it comes with the NVIDIA driver: install the driver, or run on a machine with a GPU",
};

const NVRTC: Library = Library {
    names: &["libnvrtc.so.12", "libnvrtc.so"],
    remedy: "install the pip wheel `nvidia-cuda-nvrtc-cu12` (no newer than the driver's CUDA version) \
             and put its `nvidia/cuda_nvrtc/lib` folder on LD_LIBRARY_PATH",
};

/// Checks that the `cuda` backend can start: the driver and NVRTC load and
/// CUDA's headers (which NVRTC compiles every kernel against) are found.
pub fn check_cuda_runtime() -> Result<(), TrainError> {
    for library in [&DRIVER, &NVRTC] {
        loadable(library)?;
    }
    let include = cuda_include_dir();
    if !include.join("cuda_fp16.h").is_file() {
        return Err(TrainError::GpuRuntime(format!(
            "CUDA's headers are not in {}: set CUDA_PATH to a folder whose include/ holds them \
             (the include/ folders of the pip wheels nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12 \
             and nvidia-cuda-cccl-cu12, merged)",
            include.display()
        )));
    }
    Ok(())
}

/// Where cubecl looks for CUDA's headers: `$CUDA_PATH/include`, else the
/// default toolkit's.
fn cuda_include_dir() -> PathBuf {
    let root = std::env::var_os("CUDA_PATH").map_or_else(|| PathBuf::from("/usr/local/cuda"), PathBuf::from);
    root.join("include")
}

/// Loads the first of `library`'s names that loads, and lets it go.
fn loadable(library: &Library) -> Result<(), TrainError> {
    for name in library.names {
        let name = CString::new(*name).expect("library names have no NUL");
        // SAFETY: `name` is a NUL-terminated string that outlives the call;
        // a handle dlopen returns is closed once, right away.
        unsafe {
            let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if !handle.is_null() {
                libc::dlclose(handle);
                return Ok(());
            }
        }
    }
    Err(TrainError::GpuRuntime(format!(
        "{} could not be loaded: {}",
        library.names[0], library.remedy
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_loads_passes_and_a_missing_one_is_named_with_its_remedy() {
        let present = Library {
            names: &["libraylet-absent.so", "libc.so.6"],
            remedy: "",
        };
        assert!(loadable(&present).is_ok());
        let absent = Library {
            names: &["libraylet-absent.so.1"],
            remedy: "install it",
        };
        let error = loadable(&absent).unwrap_err().to_string();
        assert_eq!(
            error,
            "this worker cannot use its GPU: libraylet-absent.so.1 could not be loaded: install it"
        );
    }

    #[test]
    fn without_a_driver_the_error_names_libcuda() {
        if !std::path::Path::new("/dev/nvidiactl").exists() {
            let error = check_cuda_runtime().unwrap_err().to_string();
            assert!(
                error.contains("libcuda.so.1") && error.contains("NVIDIA driver"),
                "{error}"
            );
        }
    }
}
