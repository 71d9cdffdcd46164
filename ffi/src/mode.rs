//! The execution mode and what the engine records under it: flushes,
//! source locations and recompile controls.

use std::ffi::c_char;

use rtpu_core::engine::{cache, deferred, location, mode};

use crate::boundary::{c_str, fallible, infallible};
use crate::error::{rtpu_error, FfiError};

/// Execution modes of `rtpu_engine_set_mode` (`uint32_t`).
/// Each op runs as its own program when it is called (the default).
pub const RTPU_MODE_EAGER: u32 = 0;
/// Ops are recorded into one pending graph per device, run as one program
/// at `rtpu_engine_flush`, `rtpu_engine_synchronize`, or when a host read
/// needs a pending value.
pub const RTPU_MODE_DEFERRED: u32 = 1;

/// Sets the process-wide execution mode (`RTPU_MODE_*`). Leaving deferred
/// mode flushes every pending graph, whose error (if any) is returned; the
/// mode is eager afterwards either way. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_set_mode(mode: u32) -> *mut rtpu_error {
    fallible("rtpu_engine_set_mode", || {
        let deferred = match mode {
            RTPU_MODE_EAGER => false,
            RTPU_MODE_DEFERRED => true,
            other => {
                return Err(FfiError::invalid(format!(
                    "mode {other}: expected RTPU_MODE_EAGER or RTPU_MODE_DEFERRED"
                )))
            }
        };
        Ok(deferred::set_deferred(deferred)?)
    })
}

/// The current execution mode (`RTPU_MODE_*`). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_mode() -> u32 {
    infallible(RTPU_MODE_EAGER, || {
        if mode::is_recording() {
            RTPU_MODE_DEFERRED
        } else {
            RTPU_MODE_EAGER
        }
    })
}

/// Runs every pending graph (without waiting for the device). `site`
/// (NUL-terminated, borrowed; NULL for the calling thread's current
/// location) names where the flush was asked for: recompiles are counted
/// and explained per site. A failed graph's error names the lines that
/// recorded its ops; storages it would have overwritten keep their values.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_flush(site: *const c_char) -> *mut rtpu_error {
    fallible("rtpu_engine_flush", || {
        let site = if site.is_null() {
            None
        } else {
            // SAFETY: non-NULL and NUL-terminated per the contract.
            Some(unsafe { c_str(site, "site") }?)
        };
        Ok(deferred::flush_all(site)?)
    })
}

/// Runs every pending graph, as `rtpu_engine_flush` does, before a
/// collective that cannot be part of a program (one the embedder stages
/// through the host across processes), counting one `collective_splits`
/// when a graph was pending. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_split_at_collective() -> *mut rtpu_error {
    fallible("rtpu_engine_split_at_collective", || {
        Ok(deferred::split_at_collective()?)
    })
}

/// Flushes every pending graph and waits until the device has run them.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_synchronize() -> *mut rtpu_error {
    fallible("rtpu_engine_synchronize", || Ok(deferred::synchronize()?))
}

/// The id of a source location text (e.g. "train.py:42"), for
/// `rtpu_location_set_current`; equal texts get equal ids. NULL gives 0,
/// the unknown location. The text is copied. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_location_intern(text: *const c_char) -> u32 {
    infallible(0, || {
        if text.is_null() {
            return 0;
        }
        // SAFETY: non-NULL and NUL-terminated per the contract.
        match unsafe { c_str(text, "text") } {
            Ok(text) => location::intern_location(text),
            Err(_) => 0,
        }
    })
}

/// Sets the location that the calling thread's next ops are recorded at
/// (what errors and recompile explanations name). Thread-safe (per thread).
#[no_mangle]
pub extern "C" fn rtpu_location_set_current(location: u32) {
    infallible((), || location::set_current_location(location))
}

/// Prints an explanation of every recompile to stderr when `on` (also
/// turned on by the environment variable `RTPU_DEBUG=recompile`).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_set_explain_recompiles(on: bool) {
    infallible((), || cache::set_explain_recompiles(on))
}

/// After `limit` recompiles at one flush site, the next one fails with an
/// error carrying its explanation; a negative `limit` removes the limit.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_engine_set_recompile_limit(limit: i64) {
    infallible((), || cache::set_recompile_limit(u64::try_from(limit).ok()))
}
