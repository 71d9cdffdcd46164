//! Execution modes, flushes, source locations, recompile controls and the
//! engine's counters.

use std::ffi::{c_char, CString};

use rtpu_core::engine::{self, cache, capture, deferred, TensorArg};

use crate::boundary::{c_str, check_struct_size, fallible, infallible, non_null, out_ptr, slice};
use crate::error::{rtpu_error, FfiError};
use crate::ops::{result_into_raw, rtpu_op_result};
use crate::runtime::{rtpu_runtime, runtime_ref};
use crate::storage::{rtpu_tensor_ref, tensor_view};

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
    /// Input buffers donated to deferred graphs.
    pub buffers_donated: u64,
}

/// `sizeof(rtpu_metrics)`. Callers built against the first ABI v0 header
/// pass 48 and get the fields up to `device_to_host_bytes`.
pub const RTPU_METRICS_STRUCT_SIZE: usize = 128;

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
            buffers_donated: m.buffers_donated,
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

/// A graph captured by `rtpu_capture_end`, replayed by `rtpu_graph_replay`.
/// Owned by the caller: free it with `rtpu_graph_destroy`. Thread-safe.
pub struct rtpu_graph {
    _private: [u8; 0],
}

/// Either a graph to replay or why the captured ops cannot be replayed.
type GraphHandle = Result<capture::CapturedGraph, CString>;

/// Tensors from a C array of `count` refs.
///
/// # Safety
/// `tensors` must point to `count` valid refs (NULL only when 0).
unsafe fn tensor_args(
    tensors: *const rtpu_tensor_ref,
    count: usize,
    what: &str,
) -> Result<Vec<TensorArg>, FfiError> {
    // SAFETY: guaranteed by the caller.
    let refs = unsafe { slice(tensors, count, what) }?;
    refs.iter()
        .enumerate()
        .map(|(i, t)| {
            // SAFETY: guaranteed by the caller.
            let (storage, view) = unsafe { tensor_view(t, &format!("{what}[{i}]")) }?;
            Ok(TensorArg { storage, view })
        })
        .collect()
}

/// Starts capturing a graph whose inputs are `inputs` (`num_inputs` refs on
/// one device, borrowed for the call): pending work runs first, then every
/// op until `rtpu_capture_end` is recorded. One capture at a time per
/// process.
#[no_mangle]
pub extern "C" fn rtpu_capture_begin(
    runtime: *const rtpu_runtime,
    inputs: *const rtpu_tensor_ref,
    num_inputs: usize,
) -> *mut rtpu_error {
    fallible("rtpu_capture_begin", || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { runtime_ref(runtime) }?;
        // SAFETY: documented as `num_inputs` refs.
        let inputs = unsafe { tensor_args(inputs, num_inputs, "inputs") }?;
        Ok(capture::begin(&inputs)?)
    })
}

/// Ends the capture: runs the recorded ops as one program, so `outputs`
/// (`num_outputs` refs, borrowed) hold their values, and writes to
/// `*graph_out` a graph that replays them on new inputs. If the ops cannot
/// be replayed (`rtpu_graph_replayable` is false, `rtpu_graph_reason` says
/// why), the values are still computed. `site` (NUL-terminated, borrowed)
/// names the graph in errors and explanations. On success the caller owns
/// `*graph_out`. The capture ends (and the mode returns to what it was)
/// even when this fails; on bad input, what it recorded runs at the next
/// flush.
#[no_mangle]
pub extern "C" fn rtpu_capture_end(
    runtime: *const rtpu_runtime,
    outputs: *const rtpu_tensor_ref,
    num_outputs: usize,
    site: *const c_char,
    graph_out: *mut *mut rtpu_graph,
) -> *mut rtpu_error {
    fallible("rtpu_capture_end", || {
        let checked = (|| {
            // SAFETY: a non-NULL handle is live per the docs.
            let rt = unsafe { runtime_ref(runtime) }?;
            let graph_out = out_ptr(graph_out, "graph_out")?;
            // SAFETY: NUL-terminated per the contract.
            let site = unsafe { c_str(site, "site") }?;
            // SAFETY: documented as `num_outputs` refs.
            let outputs = unsafe { tensor_args(outputs, num_outputs, "outputs") }?;
            Ok::<_, FfiError>((rt, graph_out, site, outputs))
        })();
        let (rt, graph_out, site, outputs) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                // The capture ends either way; what it recorded runs later.
                capture::abandon();
                return Err(e);
            }
        };
        let captured = capture::end(&rt.client, &outputs, site)?;
        let captured = captured.map_err(|reason| {
            CString::new(reason).unwrap_or_else(|_| c"(reason has a NUL)".to_owned())
        });
        let handle: Box<GraphHandle> = Box::new(captured);
        // SAFETY: checked non-NULL; written only on success.
        unsafe { *graph_out = Box::into_raw(handle).cast() };
        Ok(())
    })
}

/// # Safety
/// A non-NULL `graph` must be a live handle from `rtpu_capture_end`.
unsafe fn graph_ref<'a>(graph: *const rtpu_graph) -> Result<&'a GraphHandle, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(graph.cast::<GraphHandle>(), "graph") }
}

/// Whether the graph can be replayed. NULL gives false.
#[no_mangle]
pub extern "C" fn rtpu_graph_replayable(graph: *const rtpu_graph) -> bool {
    infallible(false, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { graph_ref(graph) }.is_ok_and(|g| g.is_ok())
    })
}

/// Why the graph cannot be replayed, or NULL when it can (or `graph` is
/// NULL). The string lives as long as the graph.
#[no_mangle]
pub extern "C" fn rtpu_graph_reason(graph: *const rtpu_graph) -> *const c_char {
    infallible(std::ptr::null(), || {
        // SAFETY: a non-NULL handle is live per the docs.
        match unsafe { graph_ref(graph) } {
            Ok(Err(reason)) => reason.as_ptr(),
            _ => std::ptr::null(),
        }
    })
}

/// Replays a replayable graph on `inputs` (`num_inputs` refs, borrowed;
/// the shapes, dtypes and layouts of the captured ones): enqueues one
/// execution, writes the inputs the graph mutates, and on success gives the
/// outputs as an owned `*result_out` (new tensors, read with
/// `rtpu_op_result_get`). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_graph_replay(
    graph: *const rtpu_graph,
    inputs: *const rtpu_tensor_ref,
    num_inputs: usize,
    result_out: *mut *mut rtpu_op_result,
) -> *mut rtpu_error {
    fallible("rtpu_graph_replay", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let graph = unsafe { graph_ref(graph) }?;
        let result_out = out_ptr(result_out, "result_out")?;
        let graph = graph.as_ref().map_err(|reason| {
            FfiError::invalid(format!(
                "the graph cannot be replayed: {}",
                reason.to_string_lossy()
            ))
        })?;
        // A wrong count is refused before any ref is read.
        if num_inputs != graph.num_inputs() {
            return Err(FfiError::invalid(format!(
                "num_inputs: the graph takes {} inputs, not {num_inputs}",
                graph.num_inputs()
            )));
        }
        // SAFETY: documented as `num_inputs` refs.
        let inputs = unsafe { tensor_args(inputs, num_inputs, "inputs") }?;
        let outputs = graph.replay(&inputs)?;
        // SAFETY: checked non-NULL; written only on success.
        unsafe { *result_out = result_into_raw(outputs) };
        Ok(())
    })
}

/// Frees a graph. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_graph_destroy(graph: *mut rtpu_graph) {
    infallible((), || {
        if !graph.is_null() {
            // SAFETY: came from `rtpu_capture_end`; destroyed once.
            drop(unsafe { Box::from_raw(graph.cast::<GraphHandle>()) });
        }
    })
}
