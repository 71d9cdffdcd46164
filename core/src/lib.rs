//! rtpu's core: everything between the C ABI and a PJRT plugin, in safe Rust.
//!
//! `runtime` wraps the PJRT C API (the only module with `unsafe`); `dtype` and
//! `error` are shared vocabulary. This crate exports no symbols: the `rtpu`
//! crate in `ffi/` is the C face of it.

pub mod builder;
pub mod dims;
pub mod dist;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod ir;
pub mod lower;
pub mod metrics;
pub mod ops;
pub mod runtime;
pub mod sharding;
pub mod storage;

pub use dims::Dims;
pub use dtype::DType;
pub use error::{Error, ErrorCode, Result};
