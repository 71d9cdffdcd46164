//! `rtpu_buffer`: an array on one device.

use rtpu_core::runtime::Buffer;
use rtpu_core::DType;

use crate::boundary::{
    check_struct_size, drop_boxed, fallible, infallible, non_null, out_ptr, slice, Out,
};
use crate::error::{rtpu_error, FfiError};
use crate::runtime::{rtpu_runtime, runtime_ref};

/// An array on one device. Owned by whoever received it; free it with
/// `rtpu_buffer_destroy`. Keeps its client alive, so it may outlive the
/// runtime it came from. Thread-safe: all calls take it as `const`.
pub struct rtpu_buffer {
    _private: [u8; 0],
}

// Element types (`uint32_t`). Host data is dense and row-major; bool is one
// byte per element (0 or 1), complex types are (real, imaginary) pairs.
pub const RTPU_DTYPE_BOOL: u32 = 1;
pub const RTPU_DTYPE_INT8: u32 = 2;
pub const RTPU_DTYPE_INT16: u32 = 3;
pub const RTPU_DTYPE_INT32: u32 = 4;
pub const RTPU_DTYPE_INT64: u32 = 5;
pub const RTPU_DTYPE_UINT8: u32 = 6;
pub const RTPU_DTYPE_UINT16: u32 = 7;
pub const RTPU_DTYPE_UINT32: u32 = 8;
pub const RTPU_DTYPE_UINT64: u32 = 9;
pub const RTPU_DTYPE_FLOAT16: u32 = 10;
pub const RTPU_DTYPE_BFLOAT16: u32 = 11;
pub const RTPU_DTYPE_FLOAT32: u32 = 12;
pub const RTPU_DTYPE_FLOAT64: u32 = 13;
pub const RTPU_DTYPE_COMPLEX64: u32 = 14;
pub const RTPU_DTYPE_COMPLEX128: u32 = 15;

const DTYPES: [(u32, DType); 15] = [
    (RTPU_DTYPE_BOOL, DType::Bool),
    (RTPU_DTYPE_INT8, DType::I8),
    (RTPU_DTYPE_INT16, DType::I16),
    (RTPU_DTYPE_INT32, DType::I32),
    (RTPU_DTYPE_INT64, DType::I64),
    (RTPU_DTYPE_UINT8, DType::U8),
    (RTPU_DTYPE_UINT16, DType::U16),
    (RTPU_DTYPE_UINT32, DType::U32),
    (RTPU_DTYPE_UINT64, DType::U64),
    (RTPU_DTYPE_FLOAT16, DType::F16),
    (RTPU_DTYPE_BFLOAT16, DType::BF16),
    (RTPU_DTYPE_FLOAT32, DType::F32),
    (RTPU_DTYPE_FLOAT64, DType::F64),
    (RTPU_DTYPE_COMPLEX64, DType::C64),
    (RTPU_DTYPE_COMPLEX128, DType::C128),
];

pub(crate) fn dtype_from_c(raw: u32) -> Result<DType, FfiError> {
    DTYPES
        .iter()
        .find(|(c, _)| *c == raw)
        .map(|(_, d)| *d)
        .ok_or_else(|| FfiError::invalid(format!("dtype {raw} is not one of RTPU_DTYPE_*")))
}

pub(crate) fn dtype_to_c(dtype: DType) -> Result<u32, FfiError> {
    DTYPES
        .iter()
        .find(|(_, d)| *d == dtype)
        .map(|(c, _)| *c)
        .ok_or_else(|| {
            FfiError::new(
                crate::error::RTPU_ERROR_CODE_UNIMPLEMENTED,
                format!("dtype {dtype} has no C code"),
            )
        })
}

/// Arguments of `rtpu_buffer_from_host`.
#[repr(C)]
pub struct rtpu_buffer_from_host_args {
    /// Set to `RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE`.
    pub struct_size: usize,
    /// Dense row-major elements; read only during the call.
    pub data: *const std::ffi::c_void,
    /// Must equal the element count times the dtype's size.
    pub data_size: usize,
    /// One of `RTPU_DTYPE_*`.
    pub dtype: u32,
    /// `num_dims` sizes, each >= 0; may be NULL for a scalar (`num_dims` 0).
    pub dims: *const i64,
    pub num_dims: usize,
    /// Index of the target device, below `rtpu_runtime_device_count`.
    pub device_index: usize,
}

/// `sizeof(rtpu_buffer_from_host_args)` in ABI v0; fields are only appended.
pub const RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE: usize = 56;

/// The `Buffer` behind a non-NULL handle.
///
/// # Safety
/// A non-NULL `buffer` must be a live handle from rtpu.
pub(crate) unsafe fn buffer_ref<'a>(
    buffer: *const rtpu_buffer,
    what: &str,
) -> Result<&'a Buffer, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(buffer.cast::<Buffer>(), what) }
}

pub(crate) fn buffer_into_raw(buffer: Buffer) -> *mut rtpu_buffer {
    Box::into_raw(Box::new(buffer)).cast()
}

/// Copies host data to a new buffer on one of the runtime's devices. The host
/// memory may be reused as soon as this returns. On success the caller owns
/// `*buffer_out`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_from_host(
    runtime: *const rtpu_runtime,
    args: *const rtpu_buffer_from_host_args,
    buffer_out: *mut *mut rtpu_buffer,
) -> *mut rtpu_error {
    fallible("rtpu_buffer_from_host", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        // SAFETY: a non-NULL `args` points to an args struct per the docs.
        let args = unsafe { non_null(args, "args") }?;
        let buffer_out = Out::new(buffer_out, "buffer_out")?;
        check_struct_size(
            "rtpu_buffer_from_host_args",
            args.struct_size,
            RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE,
        )?;
        let dtype = dtype_from_c(args.dtype)?;
        // SAFETY: documented as `num_dims` readable sizes.
        let dims = unsafe { slice(args.dims, args.num_dims, "args->dims") }?;
        // SAFETY: documented as `data_size` readable bytes.
        let data = unsafe { slice(args.data.cast::<u8>(), args.data_size, "args->data") }?;
        let device = rt.client.device(args.device_index)?;
        let buffer = rt.client.buffer_from_host(data, dtype, dims, &device)?;
        buffer_out.write(buffer_into_raw(buffer));
        Ok(())
    })
}

/// Copies the buffer to `dst` (dense, row-major), waiting for the transfer.
/// `dst_size` must equal the buffer's host size (`rtpu_buffer_host_size`).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_to_host(
    buffer: *const rtpu_buffer,
    dst: *mut std::ffi::c_void,
    dst_size: usize,
) -> *mut rtpu_error {
    fallible("rtpu_buffer_to_host", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let buffer = unsafe { buffer_ref(buffer, "buffer") }?;
        let expected = buffer.host_size()?;
        if dst_size != expected {
            return Err(FfiError::invalid(format!(
                "dst_size is {dst_size} bytes; the buffer holds {expected}"
            )));
        }
        if expected == 0 {
            return Ok(());
        }
        let dst = out_ptr(dst.cast::<u8>(), "dst")?;
        // SAFETY: the caller provides `dst_size` writable bytes at `dst`.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, dst_size) };
        buffer.copy_to_host(dst)?;
        Ok(())
    })
}

/// The body of a buffer getter: resolves `buffer`, checks `out`, and writes
/// what `get` reads from the buffer on success.
fn buffer_getter<T>(
    function: &'static str,
    buffer: *const rtpu_buffer,
    out: *mut T,
    out_name: &str,
    get: impl FnOnce(&Buffer) -> Result<T, FfiError>,
) -> *mut rtpu_error {
    fallible(function, || {
        // SAFETY: a non-NULL handle is live per the docs.
        let buffer = unsafe { buffer_ref(buffer, "buffer") }?;
        let out = Out::new(out, out_name)?;
        out.write(get(buffer)?);
        Ok(())
    })
}

/// Writes the size in bytes of the buffer's dense host copy. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_host_size(
    buffer: *const rtpu_buffer,
    size_out: *mut usize,
) -> *mut rtpu_error {
    buffer_getter("rtpu_buffer_host_size", buffer, size_out, "size_out", |b| {
        Ok(b.host_size()?)
    })
}

/// Writes the bytes the buffer occupies on its device (may differ from the
/// host size because of padding). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_on_device_size(
    buffer: *const rtpu_buffer,
    size_out: *mut usize,
) -> *mut rtpu_error {
    buffer_getter(
        "rtpu_buffer_on_device_size",
        buffer,
        size_out,
        "size_out",
        |b| Ok(b.on_device_size()?),
    )
}

/// Writes the buffer's element type, one of `RTPU_DTYPE_*`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_dtype(
    buffer: *const rtpu_buffer,
    dtype_out: *mut u32,
) -> *mut rtpu_error {
    buffer_getter("rtpu_buffer_dtype", buffer, dtype_out, "dtype_out", |b| {
        dtype_to_c(b.dtype()?)
    })
}

/// Writes the buffer's rank (number of dimensions). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_rank(
    buffer: *const rtpu_buffer,
    rank_out: *mut usize,
) -> *mut rtpu_error {
    buffer_getter("rtpu_buffer_rank", buffer, rank_out, "rank_out", |b| {
        Ok(b.dims()?.len())
    })
}

/// Writes the buffer's dimensions to `dims_out`, which holds `dims_len`
/// values; `dims_len` must equal the rank (`dims_out` may be NULL for a
/// scalar). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_dims(
    buffer: *const rtpu_buffer,
    dims_out: *mut i64,
    dims_len: usize,
) -> *mut rtpu_error {
    fallible("rtpu_buffer_dims", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let buffer = unsafe { buffer_ref(buffer, "buffer") }?;
        let dims = buffer.dims()?;
        if dims_len != dims.len() {
            return Err(FfiError::invalid(format!(
                "dims_len is {dims_len}; the buffer's rank is {}",
                dims.len()
            )));
        }
        if dims.is_empty() {
            return Ok(());
        }
        let dims_out = out_ptr(dims_out, "dims_out")?;
        // SAFETY: the caller provides `dims_len` writable values.
        unsafe { std::ptr::copy_nonoverlapping(dims.as_ptr(), dims_out, dims.len()) };
        Ok(())
    })
}

/// Copies the buffer to device `device_index` of its runtime. On success the
/// caller owns `*buffer_out`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_buffer_copy_to_device(
    buffer: *const rtpu_buffer,
    device_index: usize,
    buffer_out: *mut *mut rtpu_buffer,
) -> *mut rtpu_error {
    fallible("rtpu_buffer_copy_to_device", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let buffer = unsafe { buffer_ref(buffer, "buffer") }?;
        let buffer_out = Out::new(buffer_out, "buffer_out")?;
        let device = buffer.client().device(device_index)?;
        buffer_out.write(buffer_into_raw(buffer.copy_to_device(&device)?));
        Ok(())
    })
}

/// Frees a buffer (its device memory is released once pending work on it is
/// done). NULL is a no-op; destroying twice is undefined behaviour. Must not
/// race with other calls on the same buffer.
#[no_mangle]
pub extern "C" fn rtpu_buffer_destroy(buffer: *mut rtpu_buffer) {
    // SAFETY: a non-NULL `buffer` came from `buffer_into_raw` and is
    // destroyed once.
    infallible((), || unsafe { drop_boxed(buffer.cast::<Buffer>()) })
}

/// Gives back to the system the large host blocks that the CPU plugin freed
/// and rtpu kept for its next requests (README "Speed"), writing their
/// bytes to `*released_out`. Live buffers are untouched. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_host_cache_release(released_out: *mut u64) -> *mut rtpu_error {
    fallible("rtpu_host_cache_release", || {
        let released_out = Out::new(released_out, "released_out")?;
        released_out.write(rtpu_core::runtime::host_cache::release());
        Ok(())
    })
}
