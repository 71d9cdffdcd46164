//! Communicators and collectives: `rtpu_communicator` over devices of one
//! runtime, `rtpu_collective_start` for one rank's part, `rtpu_work` to wait
//! for its result.

use std::sync::Arc;
use std::time::Duration;

use std::ffi::{c_char, c_void};

use rtpu_core::dist::{
    Collective, Communicator, HostTransport, ProcessGroup, ReduceOp, Tensor, Work,
};
use rtpu_core::runtime::Buffer;
use rtpu_core::storage::{Storage, StorageValue};
use rtpu_core::DType;

use crate::boundary::{
    call_with_error_buffer, check_struct_size, drop_boxed, fallible, infallible, non_null, slice,
    Out,
};
use crate::buffer::dtype_to_c;
use crate::error::{rtpu_error, FfiError};
use crate::runtime::{rtpu_runtime, runtime_ref};
use crate::storage::{rtpu_storage, rtpu_tensor_ref, storage_into_raw, tensor_view};

/// Ranks that run collectives together: devices of one runtime
/// (`rtpu_communicator_new_local`, rank `r` on the `r`-th device given), or
/// one rank of a group of processes (`rtpu_communicator_new_processes`).
/// Owned by the caller (`rtpu_communicator_destroy`); works started on it
/// keep what they need, so it may be destroyed before they finish.
/// Thread-safe: the ranks of a local communicator usually call from one
/// thread each.
pub struct rtpu_communicator {
    _private: [u8; 0],
}

/// One rank's started collective, from `rtpu_collective_start`. Owned by the
/// caller (`rtpu_work_destroy`, also when it was never waited for). Use from
/// one thread at a time.
pub struct rtpu_work {
    _private: [u8; 0],
}

enum CommunicatorHandle {
    Local(Arc<Communicator>),
    Processes(Arc<ProcessGroup>),
}

enum WorkHandle {
    Local(Work),
    /// A process group's collective ran when it started: its result, until
    /// waited for, and the device it is on.
    Finished(Option<rtpu_core::Result<Option<Buffer>>>, usize),
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

/// A transport function that sends `nbytes` from `input` and receives into
/// `output` (see `rtpu_host_transport`); NULL when the transport has none.
pub type rtpu_host_transport_exchange = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        input: *const c_void,
        output: *mut c_void,
        nbytes: usize,
        error: *mut c_char,
        error_size: usize,
    ) -> i32,
>;

/// How a process communicator moves bytes between processes, for plugins
/// that cannot run collectives across processes (every CPU plugin): the
/// embedder plugs in gloo, MPI or its own. Every rank calls each function
/// in the same order. Each returns 0 on success; on failure it returns
/// nonzero and writes a NUL-terminated message of at most `error_size`
/// bytes to `error`. A function that waits on peers must give up after a
/// timeout of its own and say so: rtpu cannot interrupt it. rtpu calls them
/// one at a time per communicator, from whichever thread starts a
/// collective.
#[repr(C)]
pub struct rtpu_host_transport {
    /// Set to `RTPU_HOST_TRANSPORT_STRUCT_SIZE`.
    pub struct_size: usize,
    /// Passed to every function; must stay valid until `release`.
    pub context: *mut c_void,
    /// `nbytes` bytes of elements of `dtype` (`RTPU_DTYPE_*`) at `data`,
    /// combined in place with `reduce_op` (`RTPU_REDUCE_*`, never AVG).
    pub all_reduce: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            data: *mut c_void,
            nbytes: usize,
            dtype: u32,
            reduce_op: u32,
            error: *mut c_char,
            error_size: usize,
        ) -> i32,
    >,
    /// Every rank's `nbytes` at `input` into `output` (`nbytes` times the
    /// world size), in rank order.
    pub all_gather: rtpu_host_transport_exchange,
    /// `input` (`nbytes`) split into world-size equal pieces, piece `r` to
    /// rank `r`; `output` (`nbytes`) gets this rank's piece of every rank's
    /// input, in rank order.
    pub all_to_all: rtpu_host_transport_exchange,
    /// Rank `root`'s `nbytes` at `data` into every rank's `data`.
    pub broadcast: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            data: *mut c_void,
            nbytes: usize,
            root: usize,
            error: *mut c_char,
            error_size: usize,
        ) -> i32,
    >,
    pub barrier: Option<
        unsafe extern "C" fn(context: *mut c_void, error: *mut c_char, error_size: usize) -> i32,
    >,
    /// Called once, when rtpu no longer needs `context`; may be NULL.
    pub release: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

pub const RTPU_HOST_TRANSPORT_STRUCT_SIZE: usize = 64;

/// An embedder's transport, called through its C functions.
struct CTransport {
    context: *mut c_void,
    table: rtpu_host_transport,
}

// SAFETY: the transport's documentation requires its functions to accept
// calls from any thread, one at a time per communicator (ProcessGroup holds
// a lock across each collective).
unsafe impl Send for CTransport {}
// SAFETY: as above.
unsafe impl Sync for CTransport {}

/// Calls one transport function, turning a nonzero return into its message.
fn call_transport(name: &str, f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<(), String> {
    call_with_error_buffer(f).map_err(|(status, message)| {
        format!("the host transport's {name} failed ({status}): {message}")
    })
}

impl CTransport {
    fn exchange(
        &self,
        name: &str,
        f: rtpu_host_transport_exchange,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), String> {
        let f = f.ok_or_else(|| format!("the host transport has no {name}"))?;
        call_transport(name, |error, size| {
            // SAFETY: `input` is readable and `output` writable for the
            // lengths the function's contract gives, during the call.
            unsafe {
                f(
                    self.context,
                    input.as_ptr().cast(),
                    output.as_mut_ptr().cast(),
                    input.len(),
                    error,
                    size,
                )
            }
        })
    }
}

impl HostTransport for CTransport {
    fn all_reduce(&self, data: &mut [u8], dtype: DType, op: ReduceOp) -> Result<(), String> {
        let f = self
            .table
            .all_reduce
            .ok_or("the host transport has no all_reduce")?;
        let dtype =
            dtype_to_c(dtype).map_err(|_| format!("dtype {dtype} has no RTPU_DTYPE_* code"))?;
        let op = match op {
            ReduceOp::Sum | ReduceOp::Avg => RTPU_REDUCE_SUM,
            ReduceOp::Min => RTPU_REDUCE_MIN,
            ReduceOp::Max => RTPU_REDUCE_MAX,
            ReduceOp::Prod => RTPU_REDUCE_PROD,
        };
        call_transport("all_reduce", |error, size| {
            // SAFETY: `data` is writable for its length during the call; the
            // embedder's function follows the documented contract.
            unsafe {
                f(
                    self.context,
                    data.as_mut_ptr().cast(),
                    data.len(),
                    dtype,
                    op,
                    error,
                    size,
                )
            }
        })
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), String> {
        self.exchange("all_gather", self.table.all_gather, input, output)
    }

    fn all_to_all(&self, input: &[u8], output: &mut [u8]) -> Result<(), String> {
        self.exchange("all_to_all", self.table.all_to_all, input, output)
    }

    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), String> {
        let f = self
            .table
            .broadcast
            .ok_or("the host transport has no broadcast")?;
        call_transport("broadcast", |error, size| {
            // SAFETY: `data` is writable for its length during the call.
            unsafe {
                f(
                    self.context,
                    data.as_mut_ptr().cast(),
                    data.len(),
                    root,
                    error,
                    size,
                )
            }
        })
    }

    fn barrier(&self) -> Result<(), String> {
        let f = self
            .table
            .barrier
            .ok_or("the host transport has no barrier")?;
        // SAFETY: the embedder's function follows the documented contract.
        call_transport("barrier", |error, size| unsafe {
            f(self.context, error, size)
        })
    }
}

impl Drop for CTransport {
    fn drop(&mut self) {
        if let Some(release) = self.table.release {
            // SAFETY: called once, as documented; rtpu uses `context` no more.
            unsafe { release(self.context) };
        }
    }
}

/// Writes to `*communicator_out` this process's rank `rank` of a group of
/// `world_size` processes, its tensors on device `device_index` of
/// `runtime`, its bytes moved by `transport` (copied; its `context` is
/// released when the communicator is no longer used, also when this call
/// fails). Each collective stages the rank's tensor through host memory,
/// and first exchanges what every rank is calling (through
/// `transport->all_gather`), so ranks that disagree get an error instead of
/// mixed bytes. `rtpu_collective_start` on it runs the collective before it
/// returns; `rtpu_work_wait` hands back its result (the timeout is the
/// transport's own). On success the caller owns the communicator.
#[no_mangle]
pub extern "C" fn rtpu_communicator_new_processes(
    runtime: *const rtpu_runtime,
    device_index: usize,
    rank: usize,
    world_size: usize,
    transport: *const rtpu_host_transport,
    communicator_out: *mut *mut rtpu_communicator,
) -> *mut rtpu_error {
    fallible("rtpu_communicator_new_processes", || {
        // SAFETY: a non-NULL transport points to a table per the docs.
        let table = unsafe { non_null(transport, "transport") }?;
        check_struct_size(
            "rtpu_host_transport",
            table.struct_size,
            RTPU_HOST_TRANSPORT_STRUCT_SIZE,
        )?;
        // From here on the context is ours to release, whatever happens.
        let transport = CTransport {
            context: table.context,
            table: rtpu_host_transport { ..*table },
        };
        // SAFETY: a non-NULL handle is live per the docs.
        let runtime = unsafe { runtime_ref(runtime) }?;
        let out = Out::new(communicator_out, "communicator_out")?;
        let group = ProcessGroup::new(
            &runtime.client,
            device_index,
            rank,
            world_size,
            Box::new(transport),
        )?;
        let comm = CommunicatorHandle::Processes(group);
        out.write(Box::into_raw(Box::new(comm)).cast());
        Ok(())
    })
}

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
        let out = Out::new(communicator_out, "communicator_out")?;
        let comm = CommunicatorHandle::Local(Communicator::local(&runtime.client, devices)?);
        out.write(Box::into_raw(Box::new(comm)).cast());
        Ok(())
    })
}

/// The number of ranks; 0 for NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_communicator_size(communicator: *const rtpu_communicator) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { communicator_ref(communicator) }.map_or(0, |c| match c {
            CommunicatorHandle::Local(c) => c.size(),
            CommunicatorHandle::Processes(g) => g.size(),
        })
    })
}

/// Frees a communicator. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_communicator_destroy(communicator: *mut rtpu_communicator) {
    // SAFETY: a non-NULL `communicator` came from an
    // `rtpu_communicator_new_*`; destroyed once.
    infallible((), || unsafe {
        drop_boxed(communicator.cast::<CommunicatorHandle>())
    })
}

/// # Safety
/// A non-NULL `communicator` must be a live handle.
unsafe fn communicator_ref<'a>(
    communicator: *const rtpu_communicator,
) -> Result<&'a CommunicatorHandle, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(communicator.cast::<CommunicatorHandle>(), "communicator") }
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
        let out = Out::new(work_out, "work_out")?;
        let collective = collective_from_c(args)?;
        let tensor = match collective {
            Collective::Barrier => None,
            // SAFETY: the ref's pointers are valid per the docs.
            _ => Some(unsafe { dense_tensor(&args.input) }?),
        };
        let work = match comm {
            CommunicatorHandle::Local(comm) => {
                WorkHandle::Local(comm.submit(args.rank, collective, tensor)?)
            }
            CommunicatorHandle::Processes(group) => {
                if args.rank != group.rank() {
                    return Err(FfiError::invalid(format!(
                        "args.rank is {}, but this process is rank {} of its group",
                        args.rank,
                        group.rank()
                    )));
                }
                WorkHandle::Finished(Some(group.run(collective, tensor)), group.device())
            }
        };
        out.write(Box::into_raw(Box::new(work)).cast());
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
    let (storage, view) = unsafe { tensor_view(input, || "args.input".to_string()) }?;
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
            dims: view.sizes.into(),
        }),
        StorageValue::Buffer { dtype, .. } => Err(FfiError::invalid(format!(
            "args.input is read as {} but its storage holds {dtype}",
            view.dtype
        ))),
        StorageValue::Sharded { .. } => Err(FfiError::invalid(
            "args.input is split over a mesh (SPMD); collectives take tensors on one device"
                .to_string(),
        )),
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
        let work =
            unsafe { work.cast::<WorkHandle>().as_mut() }.ok_or_else(|| FfiError::null("work"))?;
        let (result, device) = match work {
            WorkHandle::Local(work) => (
                work.wait(Duration::from_millis(timeout_ms))?,
                work.device_index(),
            ),
            WorkHandle::Finished(result, device) => match result.take() {
                Some(result) => (result?, *device),
                None => {
                    return Err(FfiError::invalid(
                        "work: a work not waited for yet, got one already waited for".to_string(),
                    ))
                }
            },
        };
        let storage = match result {
            Some(buffer) => {
                let dtype = buffer.dtype()?;
                let storage = Storage::from_buffer(&buffer.client(), device, buffer, dtype)?;
                Some(storage)
            }
            None => None,
        };
        // With no `output_out` the storage is dropped here.
        if !output_out.is_null() {
            let storage = storage.map_or(std::ptr::null_mut(), storage_into_raw);
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
    // SAFETY: a non-NULL `work` came from `rtpu_collective_start`; destroyed
    // once.
    infallible((), || unsafe { drop_boxed(work.cast::<WorkHandle>()) })
}
