//! What the LLVM backend shares between targets; here only the narrowing of
//! a device's advertised features.

pub mod lowered_features;
