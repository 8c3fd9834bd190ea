//! NVPTX specifics `cubecl-cuda` reads: the PTX version a driver loads.

pub mod ptx_version;
