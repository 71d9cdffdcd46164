//! Execution modes, flushes, source locations, recompile controls and the
//! engine's counters.

use std::ffi::c_char;

use rtpu_core::engine::{self, cache, deferred};

use crate::boundary::{c_str, check_struct_size, fallible, infallible, out_ptr};
use crate::error::rtpu_error;

/// Engine counters since the process started, filled by `rtpu_metrics_get`.
/// Times are in nanoseconds.
#[repr(C)]
pub struct rtpu_metrics {
    /// In: set to `RTPU_METRICS_STRUCT_SIZE` by the caller.
    pub struct_size: usize,
    /// Ops run one at a time by `rtpu_op_call` (eager mode).
    pub ops_run: u64,
    /// Programs compiled by XLA.
    pub executables_compiled: u64,
    /// Programs found in the in-memory cache.
    pub cache_hits: u64,
    pub host_to_device_bytes: u64,
    pub device_to_host_bytes: u64,
    // ----- appended after ABI v0's first release (48 bytes) -----
    /// Ops recorded into pending graphs (deferred mode).
    pub ops_recorded: u64,
    /// Programs loaded from the disk cache instead of compiled.
    pub disk_cache_hits: u64,
    /// Deferred graphs run.
    pub graph_executions: u64,
    /// Compiles at a flush site that had compiled another graph before.
    pub recompiles: u64,
    pub record_ns: u64,
    pub compile_ns: u64,
    /// Time launching programs (device time overlaps the host's).
    pub execute_ns: u64,
    /// Time the host waited for device results.
    pub wait_ns: u64,
    /// PJRT buffers alive now.
    pub live_buffers: u64,
}

/// `sizeof(rtpu_metrics)`. Callers built against the first ABI v0 header
/// pass 48 and get the fields up to `device_to_host_bytes`.
pub const RTPU_METRICS_STRUCT_SIZE: usize = 120;

/// Fills `*metrics_out` up to its `struct_size` (which the caller sets, at
/// least 48). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_metrics_get(metrics_out: *mut rtpu_metrics) -> *mut rtpu_error {
    fallible("rtpu_metrics_get", || {
        let metrics_out = out_ptr(metrics_out, "metrics_out")?;
        // SAFETY: non-NULL; its first field is `struct_size`.
        let given = unsafe { (*metrics_out).struct_size };
        check_struct_size("rtpu_metrics", given, 48)?;
        let m = engine::metrics();
        let metrics = rtpu_metrics {
            struct_size: given,
            ops_run: m.ops_run,
            executables_compiled: m.executables_compiled,
            cache_hits: m.cache_hits,
            host_to_device_bytes: m.host_to_device_bytes,
            device_to_host_bytes: m.device_to_host_bytes,
            ops_recorded: m.ops_recorded,
            disk_cache_hits: m.disk_cache_hits,
            graph_executions: m.graph_executions,
            recompiles: m.recompiles,
            record_ns: m.record_ns,
            compile_ns: m.compile_ns,
            execute_ns: m.execute_ns,
            wait_ns: m.wait_ns,
            live_buffers: m.live_buffers,
        };
        let len = given.min(std::mem::size_of::<rtpu_metrics>());
        // SAFETY: the caller's struct has `given` bytes (at least the 48
        // checked above); only the first `len` of them are written.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&metrics as *const rtpu_metrics).cast::<u8>(),
                metrics_out.cast::<u8>(),
                len,
            )
        };
        Ok(())
    })
}

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
                return Err(crate::error::FfiError::invalid(format!(
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
        if deferred::is_deferred() {
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
            Ok(text) => deferred::intern_location(text),
            Err(_) => 0,
        }
    })
}

/// Sets the location that the calling thread's next ops are recorded at
/// (what errors and recompile explanations name). Thread-safe (per thread).
#[no_mangle]
pub extern "C" fn rtpu_location_set_current(location: u32) {
    infallible((), || deferred::set_current_location(location))
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
