//! Communicators and collectives: `rtpu_communicator` over devices of one
//! runtime, `rtpu_collective_start` for one rank's part, `rtpu_work` to wait
//! for its result.

use std::sync::Arc;
use std::time::Duration;

use rtpu_core::dist::{Collective, Communicator, ReduceOp, Tensor, Work};
use rtpu_core::storage::{Storage, StorageValue};

use crate::boundary::{check_struct_size, fallible, infallible, non_null, out_ptr, slice};
use crate::error::{rtpu_error, FfiError};
use crate::runtime::{rtpu_runtime, runtime_ref};
use crate::storage::{rtpu_storage, rtpu_tensor_ref, storage_into_raw, tensor_view};

/// Devices of one runtime that run collectives together: rank `r` is the
/// `r`-th device given to `rtpu_communicator_new_local`. Owned by the
/// caller (`rtpu_communicator_destroy`); works started on it keep what they
/// need, so it may be destroyed before they finish. Thread-safe: each rank
/// usually calls from its own thread.
pub struct rtpu_communicator {
    _private: [u8; 0],
}

/// One rank's started collective, from `rtpu_collective_start`. Owned by the
/// caller (`rtpu_work_destroy`, also when it was never waited for). Use from
/// one thread at a time.
pub struct rtpu_work {
    _private: [u8; 0],
}

/// Every rank gets the ranks' tensors combined with `reduce_op`.
pub const RTPU_COLLECTIVE_ALL_REDUCE: u32 = 0;
/// Every rank gets the ranks' tensors concatenated along dim 0.
pub const RTPU_COLLECTIVE_ALL_GATHER: u32 = 1;
/// The tensors combined with `reduce_op`, split along dim 0 (its size a
/// multiple of the rank count): rank `r` gets piece `r`.
pub const RTPU_COLLECTIVE_REDUCE_SCATTER: u32 = 2;
/// Each tensor split along dim 0 into one piece per rank: rank `r` gets piece
/// `r` of every rank's tensor, concatenated in rank order.
pub const RTPU_COLLECTIVE_ALL_TO_ALL: u32 = 3;
/// Every rank gets rank `root`'s tensor.
pub const RTPU_COLLECTIVE_BROADCAST: u32 = 4;
/// Completes once every rank has called it; no tensor in or out.
pub const RTPU_COLLECTIVE_BARRIER: u32 = 5;

pub const RTPU_REDUCE_SUM: u32 = 0;
/// The sum divided by the number of ranks; floating-point dtypes only.
pub const RTPU_REDUCE_AVG: u32 = 1;
pub const RTPU_REDUCE_MIN: u32 = 2;
pub const RTPU_REDUCE_MAX: u32 = 3;
pub const RTPU_REDUCE_PROD: u32 = 4;

/// Arguments of `rtpu_collective_start`.
#[repr(C)]
pub struct rtpu_collective_args {
    /// Set to `RTPU_COLLECTIVE_ARGS_STRUCT_SIZE`.
    pub struct_size: usize,
    /// One of `RTPU_COLLECTIVE_*`.
    pub collective: u32,
    /// One of `RTPU_REDUCE_*`, for all-reduce and reduce-scatter.
    pub reduce_op: u32,
    /// The calling rank, below the communicator's size.
    pub rank: usize,
    /// The rank whose tensor a broadcast sends.
    pub root: usize,
    /// This rank's tensor (ignored for a barrier): contiguous, covering all
    /// of its storage, on the rank's device. Every rank passes the same
    /// dtype and sizes. Borrowed for the call; the storage is not changed.
    pub input: rtpu_tensor_ref,
}

pub const RTPU_COLLECTIVE_ARGS_STRUCT_SIZE: usize = 80;

/// Writes to `*communicator_out` a communicator over `num_devices` distinct
/// device indices of `runtime` (`devices`, borrowed), rank `r` on
/// `devices[r]`. On success the caller owns it.
#[no_mangle]
pub extern "C" fn rtpu_communicator_new_local(
    runtime: *const rtpu_runtime,
    devices: *const usize,
    num_devices: usize,
    communicator_out: *mut *mut rtpu_communicator,
) -> *mut rtpu_error {
    fallible("rtpu_communicator_new_local", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let runtime = unsafe { runtime_ref(runtime) }?;
        // SAFETY: documented as `num_devices` indices.
        let devices = unsafe { slice(devices, num_devices, "devices") }?;
        let out = out_ptr(communicator_out, "communicator_out")?;
        let comm = Communicator::local(&runtime.client, devices)?;
        // SAFETY: checked non-NULL; written only on success.
        unsafe { out.write(Box::into_raw(Box::new(comm)).cast()) };
        Ok(())
    })
}

/// The number of ranks; 0 for NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_communicator_size(communicator: *const rtpu_communicator) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { communicator_ref(communicator) }.map_or(0, |c| c.size())
    })
}

/// Frees a communicator. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_communicator_destroy(communicator: *mut rtpu_communicator) {
    infallible((), || {
        if !communicator.is_null() {
            // SAFETY: came from `rtpu_communicator_new_local`; destroyed once.
            drop(unsafe { Box::from_raw(communicator.cast::<Arc<Communicator>>()) });
        }
    })
}

/// # Safety
/// A non-NULL `communicator` must be a live handle.
unsafe fn communicator_ref<'a>(
    communicator: *const rtpu_communicator,
) -> Result<&'a Arc<Communicator>, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(communicator.cast::<Arc<Communicator>>(), "communicator") }
}

/// Starts rank `args->rank`'s part of its next collective and writes to
/// `*work_out` a work to wait on (owned by the caller). Returns at once:
/// the collective runs when every rank has started it. Input this rank
/// alone can see is wrong (a tensor on another device, an unsupported
/// dtype, a size that does not split) is refused here and takes no part;
/// what the ranks must agree on is reported by `rtpu_work_wait` on every
/// rank.
#[no_mangle]
pub extern "C" fn rtpu_collective_start(
    communicator: *const rtpu_communicator,
    args: *const rtpu_collective_args,
    work_out: *mut *mut rtpu_work,
) -> *mut rtpu_error {
    fallible("rtpu_collective_start", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let comm = unsafe { communicator_ref(communicator) }?;
        // SAFETY: a non-NULL args points to a struct of at least
        // `struct_size` bytes per the docs.
        let args = unsafe { non_null(args, "args") }?;
        check_struct_size(
            "rtpu_collective_args",
            args.struct_size,
            RTPU_COLLECTIVE_ARGS_STRUCT_SIZE,
        )?;
        let out = out_ptr(work_out, "work_out")?;
        let collective = collective_from_c(args)?;
        let tensor = match collective {
            Collective::Barrier => None,
            // SAFETY: the ref's pointers are valid per the docs.
            _ => Some(unsafe { dense_tensor(&args.input) }?),
        };
        let work = comm.submit(args.rank, collective, tensor)?;
        // SAFETY: checked non-NULL; written only on success.
        unsafe { out.write(Box::into_raw(Box::new(work)).cast()) };
        Ok(())
    })
}

fn collective_from_c(args: &rtpu_collective_args) -> Result<Collective, FfiError> {
    let op = || match args.reduce_op {
        RTPU_REDUCE_SUM => Ok(ReduceOp::Sum),
        RTPU_REDUCE_AVG => Ok(ReduceOp::Avg),
        RTPU_REDUCE_MIN => Ok(ReduceOp::Min),
        RTPU_REDUCE_MAX => Ok(ReduceOp::Max),
        RTPU_REDUCE_PROD => Ok(ReduceOp::Prod),
        other => Err(FfiError::invalid(format!(
            "args.reduce_op is {other}, not one of RTPU_REDUCE_*"
        ))),
    };
    Ok(match args.collective {
        RTPU_COLLECTIVE_ALL_REDUCE => Collective::AllReduce(op()?),
        RTPU_COLLECTIVE_ALL_GATHER => Collective::AllGather,
        RTPU_COLLECTIVE_REDUCE_SCATTER => Collective::ReduceScatter(op()?),
        RTPU_COLLECTIVE_ALL_TO_ALL => Collective::AllToAll,
        RTPU_COLLECTIVE_BROADCAST => Collective::Broadcast { root: args.root },
        RTPU_COLLECTIVE_BARRIER => Collective::Barrier,
        other => {
            return Err(FfiError::invalid(format!(
                "args.collective is {other}, not one of RTPU_COLLECTIVE_*"
            )))
        }
    })
}

/// The device buffer behind a ref that covers its whole storage densely.
///
/// # Safety
/// `input`'s pointers must be valid as its documentation says.
unsafe fn dense_tensor(input: &rtpu_tensor_ref) -> Result<Tensor, FfiError> {
    // SAFETY: guaranteed by the caller.
    let (storage, view) = unsafe { tensor_view(input, "args.input") }?;
    let covers = view.offset == 0
        && view.is_contiguous()
        && view.numel() * view.dtype.size_in_bytes() == storage.nbytes();
    if !covers {
        return Err(FfiError::invalid(format!(
            "args.input must be contiguous and cover all of its storage ({} bytes); got sizes \
             {:?}, strides {:?}, offset {}",
            storage.nbytes(),
            view.sizes,
            view.strides,
            view.offset
        )));
    }
    match storage.value()? {
        StorageValue::Buffer { buffer, dtype } if dtype == view.dtype => Ok(Tensor {
            buffer,
            dtype,
            dims: view.sizes,
        }),
        StorageValue::Buffer { dtype, .. } => Err(FfiError::invalid(format!(
            "args.input is read as {} but its storage holds {dtype}",
            view.dtype
        ))),
        _ => Err(FfiError::invalid(
            "args.input's storage was never written".to_string(),
        )),
    }
}

/// Waits up to `timeout_ms` milliseconds for the collective. On success,
/// writes this rank's result to `*output_out` as a new storage (one
/// reference for the caller) holding the result's elements densely, or
/// NULL for a barrier; `output_out` may be NULL to drop the result. A
/// failure (ranks that disagreed, a rank that never came within the
/// timeout) is the same error on every rank, and ends the collective: a
/// later wait on any rank's work returns it. A work is waited for once.
#[no_mangle]
pub extern "C" fn rtpu_work_wait(
    work: *mut rtpu_work,
    timeout_ms: u64,
    output_out: *mut *mut rtpu_storage,
) -> *mut rtpu_error {
    fallible("rtpu_work_wait", || {
        // SAFETY: a non-NULL handle is live and used by one thread per the docs.
        let work = unsafe { work.cast::<Work>().as_mut() }.ok_or_else(|| FfiError::null("work"))?;
        let result = work.wait(Duration::from_millis(timeout_ms))?;
        let storage = match result {
            Some(buffer) => {
                let dtype = buffer.dtype()?;
                let device = work.device_index();
                let storage = Storage::from_buffer(&buffer.client(), device, buffer, dtype)?;
                storage_into_raw(storage)
            }
            None => std::ptr::null_mut(),
        };
        if output_out.is_null() {
            if !storage.is_null() {
                // SAFETY: made just above with one reference.
                drop(unsafe { Arc::from_raw(storage.cast::<Storage>()) });
            }
        } else {
            // SAFETY: non-NULL per the check; written only on success.
            unsafe { output_out.write(storage) };
        }
        Ok(())
    })
}

/// Frees a work. Dropping one never waited for gives up its result; the
/// other ranks' collective is not affected. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_work_destroy(work: *mut rtpu_work) {
    infallible((), || {
        if !work.is_null() {
            // SAFETY: came from `rtpu_collective_start`; destroyed once.
            drop(unsafe { Box::from_raw(work.cast::<Work>()) });
        }
    })
}
