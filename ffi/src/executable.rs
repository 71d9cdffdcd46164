//! `rtpu_executable`: compiled StableHLO programs, their execution and
//! serialisation.

use std::ffi::c_void;

use rtpu_core::engine::disk_cache::hash128;
use rtpu_core::runtime::{Buffer, CompileOptions, ExecuteOptions, LoadedExecutable};

use crate::boundary::{
    check_struct_size, drop_boxed, fallible, infallible, non_null, out_ptr, slice, Out,
};
use crate::buffer::{buffer_into_raw, buffer_ref, rtpu_buffer};
use crate::error::{rtpu_error, FfiError};
use crate::runtime::{rtpu_runtime, runtime_ref};

/// A compiled program loaded on its devices. Owned by whoever received it;
/// free it with `rtpu_executable_destroy`. Keeps its client alive.
/// Thread-safe: executions may run concurrently.
pub struct rtpu_executable {
    _private: [u8; 0],
}

/// An owned byte string (e.g. a serialised executable, a path); free it with
/// `rtpu_bytes_destroy`.
pub struct rtpu_bytes {
    _private: [u8; 0],
}

/// Arguments of `rtpu_executable_compile`.
#[repr(C)]
pub struct rtpu_compile_args {
    /// Set to `RTPU_COMPILE_ARGS_STRUCT_SIZE`.
    pub struct_size: usize,
    /// StableHLO module as MLIR text, `code_size` bytes (no NUL needed).
    pub code: *const std::ffi::c_char,
    pub code_size: usize,
    /// >= 1.
    pub num_replicas: usize,
    /// >= 1.
    pub num_partitions: usize,
    /// Run XLA's SPMD partitioner over the module's `mhlo.sharding`s.
    pub use_spmd_partitioning: bool,
}

/// `sizeof(rtpu_compile_args)` in ABI v0; fields are only ever appended.
pub const RTPU_COMPILE_ARGS_STRUCT_SIZE: usize = 48;

/// Arguments of `rtpu_executable_execute`.
#[repr(C)]
pub struct rtpu_execute_args {
    /// Set to `RTPU_EXECUTE_ARGS_STRUCT_SIZE`.
    pub struct_size: usize,
    /// `num_devices * num_args` buffers, device-major: the arguments of
    /// device d are `arguments[d * num_args ...]`. May be NULL when empty.
    pub arguments: *const *const rtpu_buffer,
    /// Arguments per device.
    pub num_args: usize,
    /// Argument indices the program may donate (consume) where it declares an
    /// output alias; `num_donated` entries, NULL when 0. A donated buffer must
    /// still be destroyed, but its contents are gone.
    pub donated: *const usize,
    pub num_donated: usize,
}

/// `sizeof(rtpu_execute_args)` in ABI v0; fields are only ever appended.
pub const RTPU_EXECUTE_ARGS_STRUCT_SIZE: usize = 40;

/// # Safety
/// A non-NULL `exe` must be a live handle from rtpu.
unsafe fn executable_ref<'a>(
    exe: *const rtpu_executable,
) -> Result<&'a LoadedExecutable, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(exe.cast::<LoadedExecutable>(), "executable") }
}

fn executable_into_raw(exe: LoadedExecutable) -> *mut rtpu_executable {
    Box::into_raw(Box::new(exe)).cast()
}

/// Compiles a StableHLO module for the runtime's devices. Invalid programs
/// give an error carrying XLA's message. On success the caller owns
/// `*executable_out`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_executable_compile(
    runtime: *const rtpu_runtime,
    args: *const rtpu_compile_args,
    executable_out: *mut *mut rtpu_executable,
) -> *mut rtpu_error {
    fallible("rtpu_executable_compile", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        // SAFETY: a non-NULL `args` points to an args struct per the docs.
        let args = unsafe { non_null(args, "args") }?;
        let executable_out = Out::new(executable_out, "executable_out")?;
        check_struct_size(
            "rtpu_compile_args",
            args.struct_size,
            RTPU_COMPILE_ARGS_STRUCT_SIZE,
        )?;
        if args.code.is_null() {
            return Err(FfiError::null("args->code"));
        }
        // SAFETY: documented as `code_size` readable bytes.
        let code = unsafe { slice(args.code.cast::<u8>(), args.code_size, "args->code") }?;
        let code = std::str::from_utf8(code)
            .map_err(|_| FfiError::invalid("args->code is not UTF-8 text"))?;
        let options = CompileOptions {
            num_replicas: args.num_replicas,
            num_partitions: args.num_partitions,
            use_spmd_partitioning: args.use_spmd_partitioning,
            ..CompileOptions::default()
        };
        let exe = rt.client.compile(code, &options)?;
        executable_out.write(executable_into_raw(exe));
        Ok(())
    })
}

/// The number of devices the executable runs on (replicas x partitions).
/// NULL gives 0. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_executable_num_devices(executable: *const rtpu_executable) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { executable_ref(executable) }.map_or(0, |e| e.devices().len())
    })
}

/// The number of outputs per device. NULL gives 0. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_executable_num_outputs(executable: *const rtpu_executable) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { executable_ref(executable) }.map_or(0, |e| e.num_outputs())
    })
}

/// Runs the program and waits for it. Arguments are checked against the
/// program (count, dtype, shape) first; a mismatch is INVALID_ARGUMENT and
/// nothing runs. On success, `outputs_out` (which holds `outputs_len` =
/// num_devices * num_outputs pointers, device-major) receives new buffers the
/// caller owns; on failure it is untouched. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_executable_execute(
    executable: *const rtpu_executable,
    args: *const rtpu_execute_args,
    outputs_out: *mut *mut rtpu_buffer,
    outputs_len: usize,
) -> *mut rtpu_error {
    fallible("rtpu_executable_execute", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let exe = unsafe { executable_ref(executable) }?;
        // SAFETY: a non-NULL `args` points to an args struct per the docs.
        let args = unsafe { non_null(args, "args") }?;
        check_struct_size(
            "rtpu_execute_args",
            args.struct_size,
            RTPU_EXECUTE_ARGS_STRUCT_SIZE,
        )?;
        let num_devices = exe.devices().len();
        let expected_outputs = num_devices * exe.num_outputs();
        if outputs_len != expected_outputs {
            return Err(FfiError::invalid(format!(
                "outputs_len is {outputs_len}; the executable produces {expected_outputs} \
                 ({num_devices} devices x {} outputs)",
                exe.num_outputs()
            )));
        }
        if expected_outputs > 0 {
            out_ptr(outputs_out, "outputs_out")?;
        }
        let total = num_devices
            .checked_mul(args.num_args)
            .ok_or_else(|| FfiError::invalid("args->num_args is too large"))?;
        // SAFETY: documented as `num_devices * num_args` handles.
        let handles = unsafe { slice(args.arguments, total, "args->arguments") }?;
        let buffers = handles
            .iter()
            .enumerate()
            // SAFETY: each non-NULL element is a live buffer handle per the docs.
            .map(|(i, &h)| unsafe { buffer_ref(h, &format!("args->arguments[{i}]")) })
            .collect::<Result<Vec<&Buffer>, _>>()?;
        let rows: Vec<&[&Buffer]> = if args.num_args == 0 {
            vec![&[]; num_devices]
        } else {
            buffers.chunks(args.num_args).collect()
        };
        // SAFETY: documented as `num_donated` indices.
        let donate = unsafe { slice(args.donated, args.num_donated, "args->donated") }?.to_vec();
        let outputs = exe.execute(
            &rows,
            &ExecuteOptions {
                donate,
                ..Default::default()
            },
        )?;
        for (i, buffer) in outputs
            .into_iter()
            .flatten()
            .enumerate()
            .take(expected_outputs)
        {
            // SAFETY: `outputs_out` holds `outputs_len` slots (checked above).
            unsafe { *outputs_out.add(i) = buffer_into_raw(buffer) };
        }
        Ok(())
    })
}

/// Starts what `rtpu_executable_serialize` writes, before a checksum and
/// the plugin's bytes.
const SERIALIZED_MAGIC: &[u8; 8] = b"RTPUEXE1";
/// The checksum is the disk cache's `hash128` of the plugin's bytes.
const CHECKSUM_BYTES: usize = 16;

/// The plugin's bytes inside `bytes`, once its magic and checksum hold.
/// The plugin gets nothing else: it aborts the process on some corrupted
/// executables (a failed CHECK while reading its buffer assignment), and
/// one that loads would run corrupted machine code.
fn checked_payload(bytes: &[u8]) -> Result<&[u8], FfiError> {
    let not_ours = |why: &str| {
        FfiError::invalid(format!(
            "data is not an executable from rtpu_executable_serialize: {why}"
        ))
    };
    let body = bytes
        .strip_prefix(SERIALIZED_MAGIC)
        .ok_or_else(|| not_ours("it does not start with its magic"))?;
    let (sum, payload) = body
        .split_at_checked(CHECKSUM_BYTES)
        .ok_or_else(|| not_ours("it is truncated"))?;
    if sum != hash128(&payload) {
        return Err(not_ours(
            "its checksum does not match (corrupted or truncated)",
        ));
    }
    Ok(payload)
}

/// Serialises the executable; load it again with `rtpu_executable_deserialize`
/// on the same plugin version. The bytes carry a checksum, so corrupted
/// ones are refused before they reach the plugin. On success the caller
/// owns `*bytes_out`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_executable_serialize(
    executable: *const rtpu_executable,
    bytes_out: *mut *mut rtpu_bytes,
) -> *mut rtpu_error {
    fallible("rtpu_executable_serialize", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let exe = unsafe { executable_ref(executable) }?;
        let bytes_out = Out::new(bytes_out, "bytes_out")?;
        let payload = exe.serialize()?;
        let mut bytes = Vec::with_capacity(SERIALIZED_MAGIC.len() + CHECKSUM_BYTES + payload.len());
        bytes.extend_from_slice(SERIALIZED_MAGIC);
        bytes.extend_from_slice(&hash128(&payload));
        bytes.extend_from_slice(&payload);
        bytes_out.write(Box::into_raw(Box::new(bytes)).cast());
        Ok(())
    })
}

/// Loads an executable from `size` bytes made by `rtpu_executable_serialize`;
/// other bytes (corrupted, truncated) are INVALID_ARGUMENT. `data` is only
/// read during the call. On success the caller owns `*executable_out`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_executable_deserialize(
    runtime: *const rtpu_runtime,
    data: *const c_void,
    size: usize,
    executable_out: *mut *mut rtpu_executable,
) -> *mut rtpu_error {
    fallible("rtpu_executable_deserialize", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        let executable_out = Out::new(executable_out, "executable_out")?;
        if data.is_null() {
            return Err(FfiError::null("data"));
        }
        // SAFETY: documented as `size` readable bytes.
        let bytes = unsafe { slice(data.cast::<u8>(), size, "data") }?;
        let exe = rt.client.deserialize(checked_payload(bytes)?)?;
        executable_out.write(executable_into_raw(exe));
        Ok(())
    })
}

/// Frees an executable. NULL is a no-op; destroying twice is undefined
/// behaviour. Must not race with other calls on the same executable.
#[no_mangle]
pub extern "C" fn rtpu_executable_destroy(executable: *mut rtpu_executable) {
    // SAFETY: a non-NULL `executable` came from `executable_into_raw`;
    // destroyed once.
    infallible((), || unsafe {
        drop_boxed(executable.cast::<LoadedExecutable>())
    })
}

/// # Safety
/// A non-NULL `bytes` must be a live handle from rtpu.
unsafe fn bytes_ref<'a>(bytes: *const rtpu_bytes) -> Option<&'a Vec<u8>> {
    // SAFETY: guaranteed by the caller.
    unsafe { bytes.cast::<Vec<u8>>().as_ref() }
}

/// The bytes' data, valid until `rtpu_bytes_destroy`. NULL gives NULL.
#[no_mangle]
pub extern "C" fn rtpu_bytes_data(bytes: *const rtpu_bytes) -> *const u8 {
    infallible(std::ptr::null(), || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { bytes_ref(bytes) }.map_or(std::ptr::null(), |b| b.as_ptr())
    })
}

/// The number of bytes. NULL gives 0.
#[no_mangle]
pub extern "C" fn rtpu_bytes_size(bytes: *const rtpu_bytes) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { bytes_ref(bytes) }.map_or(0, |b| b.len())
    })
}

/// Frees the bytes. NULL is a no-op; destroying twice is undefined behaviour.
#[no_mangle]
pub extern "C" fn rtpu_bytes_destroy(bytes: *mut rtpu_bytes) {
    // SAFETY: a non-NULL `bytes` is a Box<Vec<u8>> from rtpu
    // (`rtpu_executable_serialize`, `rtpu_cache_dir`); destroyed once.
    infallible((), || unsafe { drop_boxed(bytes.cast::<Vec<u8>>()) })
}
