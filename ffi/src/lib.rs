//! librtpu: rtpu's stable C ABI over `rtpu-core`.
//!
//! Conventions (README "API conventions"): fallible calls return an
//! `rtpu_error*` (NULL on success) the caller destroys; outputs come last and
//! are written only on success; calls that will grow take an args struct whose
//! first field is `struct_size`; NULL or out-of-range input is
//! INVALID_ARGUMENT; a panic inside rtpu is a PANIC error, never an abort.

// Exported types use C's naming.
#![allow(non_camel_case_types)]
// Exports take raw pointers from C, where `unsafe fn` means nothing; each
// documents its pointer contract instead and checks NULL itself.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod boundary;
pub mod buffer;
pub mod cache;
pub mod collective;
pub mod error;
pub mod event;
pub mod executable;
pub mod graph;
pub mod key_value;
pub mod metrics;
pub mod mode;
pub mod ops;
pub mod runtime;
pub mod sharding;
pub mod storage;

use crate::boundary::fallible;
use crate::error::rtpu_error;

/// The C ABI's version. Bumped on any incompatible change; appended struct
/// fields and new functions do not change it. 1: the `rtpu_metrics` struct
/// gave way to metrics read by name (`rtpu_metric_*`).
pub const RTPU_ABI_VERSION: u32 = 1;

/// rtpu's release major version (rtpu tracks torch's version; Cargo.toml's
/// version, which a test checks).
pub const RTPU_VERSION_MAJOR: u32 = 2;
/// rtpu's release minor version.
pub const RTPU_VERSION_MINOR: u32 = 11;
/// rtpu's release patch version.
pub const RTPU_VERSION_PATCH: u32 = 0;
/// `RTPU_VERSION_MAJOR * 10000 + RTPU_VERSION_MINOR * 100 + RTPU_VERSION_PATCH`.
pub const RTPU_VERSION: u32 = 21100;

/// The ABI version of the loaded library; compare with `RTPU_ABI_VERSION`
/// from the header you compiled against. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_abi_version() -> u32 {
    RTPU_ABI_VERSION
}

/// The loaded library's `RTPU_VERSION`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_version() -> u32 {
    RTPU_VERSION
}

/// Panics inside rtpu on purpose and returns the resulting PANIC error, so
/// callers can test that a panic never takes their process down. For tests
/// only. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_testing_panic() -> *mut rtpu_error {
    fallible("rtpu_testing_panic", || {
        panic!("rtpu_testing_panic was called")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_constants_match_cargo() {
        let parse = |s: &str| s.parse::<u32>().unwrap();
        assert_eq!(RTPU_VERSION_MAJOR, parse(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(RTPU_VERSION_MINOR, parse(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(RTPU_VERSION_PATCH, parse(env!("CARGO_PKG_VERSION_PATCH")));
        assert_eq!(
            RTPU_VERSION,
            RTPU_VERSION_MAJOR * 10000 + RTPU_VERSION_MINOR * 100 + RTPU_VERSION_PATCH
        );
    }

    #[test]
    fn struct_size_constants_match_the_structs() {
        use std::mem::size_of;
        assert_eq!(
            runtime::RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE,
            size_of::<runtime::rtpu_runtime_open_args>()
        );
        assert_eq!(
            key_value::RTPU_KEY_VALUE_STORE_STRUCT_SIZE,
            size_of::<key_value::rtpu_key_value_store>()
        );
        assert_eq!(
            runtime::RTPU_DEVICE_INFO_STRUCT_SIZE,
            size_of::<runtime::rtpu_device_info>()
        );
        assert_eq!(
            buffer::RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE,
            size_of::<buffer::rtpu_buffer_from_host_args>()
        );
        assert_eq!(
            executable::RTPU_COMPILE_ARGS_STRUCT_SIZE,
            size_of::<executable::rtpu_compile_args>()
        );
        assert_eq!(
            executable::RTPU_EXECUTE_ARGS_STRUCT_SIZE,
            size_of::<executable::rtpu_execute_args>()
        );
        assert_eq!(
            ops::RTPU_OP_OUTPUT_STRUCT_SIZE,
            size_of::<ops::rtpu_op_output>()
        );
        assert_eq!(
            cache::RTPU_CACHE_INFO_STRUCT_SIZE,
            size_of::<cache::rtpu_cache_info>()
        );
        assert_eq!(
            collective::RTPU_COLLECTIVE_ARGS_STRUCT_SIZE,
            size_of::<collective::rtpu_collective_args>()
        );
        assert_eq!(
            collective::RTPU_HOST_TRANSPORT_STRUCT_SIZE,
            size_of::<collective::rtpu_host_transport>()
        );
        assert_eq!(
            sharding::RTPU_SHARDING_STRUCT_SIZE,
            size_of::<sharding::rtpu_sharding>()
        );
    }
}

/// Rust's allocations in librtpu go through mimalloc: recording an op makes
/// and frees dozens of small blocks (nodes, types, views), and glibc's
/// malloc and free were a fifth of the instructions of a recorded training
/// step. Only Rust's own allocations: the plugin, torch and C callers keep
/// theirs, and nothing crosses the boundary to be freed on the other side.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
