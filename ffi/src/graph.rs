//! Captured graphs: ops recorded once between `rtpu_capture_begin` and
//! `rtpu_capture_end`, replayed on new inputs with no per-op work.

use std::ffi::{c_char, CString};

use rtpu_core::engine::{capture, TensorArg};

use crate::boundary::{c_str, drop_boxed, fallible, infallible, non_null, slice, Out};
use crate::error::{rtpu_error, FfiError};
use crate::ops::{result_into_raw, rtpu_op_result};
use crate::runtime::{rtpu_runtime, runtime_ref};
use crate::storage::{rtpu_tensor_ref, tensor_view};

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
            let (storage, view) = unsafe { tensor_view(t, || format!("{what}[{i}]")) }?;
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
            let graph_out = Out::new(graph_out, "graph_out")?;
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
        graph_out.write(Box::into_raw(handle).cast());
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
        let result_out = Out::new(result_out, "result_out")?;
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
        result_out.write(result_into_raw(graph.replay(&inputs)?));
        Ok(())
    })
}

/// Frees a graph. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_graph_destroy(graph: *mut rtpu_graph) {
    // SAFETY: a non-NULL `graph` came from `rtpu_capture_end`; destroyed
    // once.
    infallible((), || unsafe { drop_boxed(graph.cast::<GraphHandle>()) })
}
