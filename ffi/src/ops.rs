//! The generic op call: ATen ops by schema name, with arguments as tagged
//! values mirroring `c10::IValue`.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use rtpu_core::engine::{self, Arg, Output, TensorArg};

use crate::boundary::{
    c_str, check_struct_size, drop_boxed, fallible, infallible, non_null, out_ptr, slice, Out,
};
use crate::buffer::{dtype_from_c, dtype_to_c};
use crate::error::{rtpu_error, FfiError};
use crate::runtime::{rtpu_runtime, runtime_ref};
use crate::storage::{rtpu_storage, rtpu_tensor_ref, storage_into_raw, tensor_view};

// Tags of `rtpu_op_arg` (`uint32_t`).
/// `None` (an absent optional).
pub const RTPU_ARG_NONE: u32 = 0;
/// `tensor` is set.
pub const RTPU_ARG_TENSOR: u32 = 1;
/// `int_value` is set (also an integral `Scalar`, `SymInt`, `Layout`, `MemoryFormat`).
pub const RTPU_ARG_INT: u32 = 2;
/// `double_value` is set (also a floating `Scalar`).
pub const RTPU_ARG_DOUBLE: u32 = 3;
/// `bool_value` is set (also a boolean `Scalar`).
pub const RTPU_ARG_BOOL: u32 = 4;
/// `int_list`/`list_size` are set.
pub const RTPU_ARG_INT_LIST: u32 = 5;
/// `double_list`/`list_size` are set.
pub const RTPU_ARG_DOUBLE_LIST: u32 = 6;
/// `tensor_list`/`list_size` are set; an element whose `storage` is NULL is
/// an absent optional tensor.
pub const RTPU_ARG_TENSOR_LIST: u32 = 7;
/// `int_value` is an `RTPU_DTYPE_*`.
pub const RTPU_ARG_DTYPE: u32 = 8;
/// `string_value` is set.
pub const RTPU_ARG_STRING: u32 = 9;
/// `int_value` is a device index of the runtime.
pub const RTPU_ARG_DEVICE: u32 = 10;
/// A random generator: `int_list` holds `{seed, offset}` (`list_size` 2).
pub const RTPU_ARG_GENERATOR: u32 = 11;

/// One argument of `rtpu_op_call`; `tag` says which fields are set. All
/// pointers are borrowed for the call only.
#[repr(C)]
pub struct rtpu_op_arg {
    /// One of `RTPU_ARG_*`.
    pub tag: u32,
    pub tensor: rtpu_tensor_ref,
    pub int_value: i64,
    pub double_value: f64,
    pub bool_value: bool,
    pub int_list: *const i64,
    pub double_list: *const f64,
    pub tensor_list: *const rtpu_tensor_ref,
    pub list_size: usize,
    /// NUL-terminated.
    pub string_value: *const c_char,
}

/// The result of an op call; free it with `rtpu_op_result_destroy`.
pub struct rtpu_op_result {
    _private: [u8; 0],
}

/// One output of an op, filled by `rtpu_op_result_get`.
#[repr(C)]
pub struct rtpu_op_output {
    /// In: set to `RTPU_OP_OUTPUT_STRUCT_SIZE` by the caller.
    pub struct_size: usize,
    /// A new storage (one reference, which the caller must release), or NULL
    /// when the output is argument `alias_of` itself (in-place and out= ops)
    /// or absent.
    pub storage: *mut rtpu_storage,
    /// The index of the argument this output is, or -1 for a new tensor.
    /// `storage` NULL with `alias_of` -1 means no tensor (ATen's undefined
    /// tensor, e.g. a gradient `output_mask` did not ask for).
    pub alias_of: i64,
    /// The new tensor's view (unset for aliases); `sizes` and `strides` are
    /// owned by the result and live until `rtpu_op_result_destroy`.
    pub storage_offset: i64,
    pub sizes: *const i64,
    pub strides: *const i64,
    pub ndim: usize,
    /// One of `RTPU_DTYPE_*` (unset for aliases).
    pub dtype: u32,
}

/// `sizeof(rtpu_op_output)` in ABI v0.
pub const RTPU_OP_OUTPUT_STRUCT_SIZE: usize = 64;

/// No tensor and no alias, with this ABI's `struct_size`: what a caller
/// passes in, and what is left of an output that is not a new tensor.
impl Default for rtpu_op_output {
    fn default() -> rtpu_op_output {
        rtpu_op_output {
            struct_size: RTPU_OP_OUTPUT_STRUCT_SIZE,
            storage: std::ptr::null_mut(),
            alias_of: -1,
            storage_offset: 0,
            sizes: std::ptr::null(),
            strides: std::ptr::null(),
            ndim: 0,
            dtype: 0,
        }
    }
}

fn op_names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| {
        engine::op_names()
            .iter()
            .map(|name| CString::new(*name).expect("op names have no NUL"))
            .collect()
    })
}

/// The number of ATen ops rtpu runs natively. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_op_count() -> usize {
    infallible(0, || op_names().len())
}

/// The schema name (e.g. "aten::add.Tensor") of op `index`, below
/// `rtpu_op_count()`; the index is the op's id for `rtpu_op_call`. Out of
/// range gives NULL. The string is static. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_op_name(index: usize) -> *const c_char {
    infallible(std::ptr::null(), || {
        op_names()
            .get(index)
            .map_or(std::ptr::null(), |n| n.as_ptr())
    })
}

/// Converts one C argument into the engine's form.
///
/// # Safety
/// The pointers in `arg` must be valid as its documentation says.
unsafe fn convert_arg(arg: &rtpu_op_arg, index: usize) -> Result<Arg, FfiError> {
    // This runs for every argument of every op: the argument's name is
    // formatted only for an error.
    let what = || format!("args[{index}]");
    let named = |e: FfiError| e.within(&what());
    let tensor = |t: &rtpu_tensor_ref, field: &dyn Fn() -> String| -> Result<TensorArg, FfiError> {
        // SAFETY: guaranteed by the caller.
        let (storage, view) = unsafe { tensor_view(t, field) }?;
        Ok(TensorArg { storage, view })
    };
    Ok(match arg.tag {
        RTPU_ARG_NONE => Arg::None,
        RTPU_ARG_TENSOR => Arg::Tensor(tensor(&arg.tensor, &|| format!("{}.tensor", what()))?),
        RTPU_ARG_INT => Arg::Int(arg.int_value),
        RTPU_ARG_DOUBLE => Arg::Float(arg.double_value),
        RTPU_ARG_BOOL => Arg::Bool(arg.bool_value),
        RTPU_ARG_INT_LIST => {
            // SAFETY: guaranteed by the caller.
            let ints = unsafe { slice(arg.int_list, arg.list_size, "int_list") }.map_err(named)?;
            Arg::IntList(ints.to_vec())
        }
        RTPU_ARG_DOUBLE_LIST => {
            // SAFETY: guaranteed by the caller.
            let floats =
                unsafe { slice(arg.double_list, arg.list_size, "double_list") }.map_err(named)?;
            Arg::FloatList(floats.to_vec())
        }
        RTPU_ARG_TENSOR_LIST => {
            // SAFETY: guaranteed by the caller.
            let items =
                unsafe { slice(arg.tensor_list, arg.list_size, "tensor_list") }.map_err(named)?;
            Arg::TensorList(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        if t.storage.is_null() {
                            Ok(None)
                        } else {
                            tensor(t, &|| format!("{}.tensor_list[{i}]", what())).map(Some)
                        }
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
        RTPU_ARG_DTYPE => Arg::ScalarType(dtype_from_c(arg.int_value as u32)?),
        RTPU_ARG_STRING => {
            // SAFETY: guaranteed by the caller.
            let text = unsafe { c_str(arg.string_value, "string_value") }.map_err(named)?;
            Arg::Str(text.to_string())
        }
        RTPU_ARG_DEVICE => Arg::Device(arg.int_value),
        RTPU_ARG_GENERATOR => {
            // SAFETY: guaranteed by the caller.
            let state = unsafe { slice(arg.int_list, arg.list_size, "int_list") }.map_err(named)?;
            match state {
                [seed, offset] => Arg::Generator {
                    seed: *seed as u64,
                    offset: *offset as u64,
                },
                _ => {
                    return Err(FfiError::invalid(format!(
                        "{}: a generator is {{seed, offset}}",
                        what()
                    )))
                }
            }
        }
        other => {
            return Err(FfiError::invalid(format!(
                "{}.tag is {other}; expected one of RTPU_ARG_*",
                what()
            )))
        }
    })
}

/// Runs op `op` (an index below `rtpu_op_count()`) on the runtime's devices.
/// The op is checked (shapes, dtypes, index ranges) and enqueued on the
/// device; in-place outputs take their new values before this returns, and
/// an error this call reports leaves every argument's storage as it was.
/// Execution itself is asynchronous: a later read waits for it (a failure
/// there, rare once the checks passed, surfaces at that read). On success
/// the caller owns `*result_out`. Thread-safe (ops on disjoint storages may
/// run concurrently).
#[no_mangle]
pub extern "C" fn rtpu_op_call(
    runtime: *const rtpu_runtime,
    op: usize,
    args: *const rtpu_op_arg,
    num_args: usize,
    result_out: *mut *mut rtpu_op_result,
) -> *mut rtpu_error {
    fallible("rtpu_op_call", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        let result_out = Out::new(result_out, "result_out")?;
        if op >= op_names().len() {
            return Err(FfiError::invalid(format!(
                "op {op} is not below rtpu_op_count() ({})",
                op_names().len()
            )));
        }
        // SAFETY: documented as `num_args` arguments.
        let raw = unsafe { slice(args, num_args, "args") }?;
        let args = raw
            .iter()
            .enumerate()
            // SAFETY: each argument's pointers are valid per the docs.
            .map(|(i, a)| unsafe { convert_arg(a, i) })
            .collect::<Result<Vec<_>, _>>()?;
        result_out.write(result_into_raw(engine::call(&rt.client, op, &args)?));
        Ok(())
    })
}

/// An owned `rtpu_op_result` holding `outputs`; a new output's sizes and
/// strides are handed to C from its view, which the result keeps.
pub(crate) fn result_into_raw(outputs: Vec<Output>) -> *mut rtpu_op_result {
    Box::into_raw(Box::new(outputs)).cast()
}

/// # Safety
/// A non-NULL `result` must be a live handle from `rtpu_op_call`.
unsafe fn result_ref<'a>(result: *const rtpu_op_result) -> Result<&'a Vec<Output>, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(result.cast::<Vec<Output>>(), "result") }
}

/// The number of outputs. NULL gives 0.
#[no_mangle]
pub extern "C" fn rtpu_op_result_count(result: *const rtpu_op_result) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { result_ref(result) }.map_or(0, |r| r.len())
    })
}

/// Fills `*output_out` (whose `struct_size` the caller sets) with output
/// `index`. A new tensor's `storage` is a new reference the caller releases.
#[no_mangle]
pub extern "C" fn rtpu_op_result_get(
    result: *const rtpu_op_result,
    index: usize,
    output_out: *mut rtpu_op_output,
) -> *mut rtpu_error {
    fallible("rtpu_op_result_get", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let result = unsafe { result_ref(result) }?;
        let output_out = out_ptr(output_out, "output_out")?;
        // SAFETY: non-NULL; its first field is `struct_size`.
        let given = unsafe { (*output_out).struct_size };
        check_struct_size("rtpu_op_output", given, RTPU_OP_OUTPUT_STRUCT_SIZE)?;
        let item = result.get(index).ok_or_else(|| {
            FfiError::invalid(format!(
                "output index {index} is not below {}",
                result.len()
            ))
        })?;
        let output = match item {
            Output::Alias(arg) => rtpu_op_output {
                struct_size: given,
                alias_of: *arg as i64,
                ..Default::default()
            },
            Output::None => rtpu_op_output {
                struct_size: given,
                ..Default::default()
            },
            Output::New { storage, view } => {
                // The dtype first: nothing may fail after a reference is handed out.
                let dtype = dtype_to_c(view.dtype)?;
                rtpu_op_output {
                    struct_size: given,
                    storage: storage_into_raw(storage.clone()),
                    alias_of: -1,
                    storage_offset: view.offset,
                    sizes: view.sizes.as_ptr(),
                    strides: view.strides.as_ptr(),
                    ndim: view.sizes.len(),
                    dtype,
                }
            }
        };
        // SAFETY: the caller's struct is at least the v0 size checked above.
        unsafe { output_out.write(output) };
        Ok(())
    })
}

/// Frees a result (storages handed out by `rtpu_op_result_get` keep their
/// own references). NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_op_result_destroy(result: *mut rtpu_op_result) {
    // SAFETY: a non-NULL `result` came from `result_into_raw`; destroyed
    // once.
    infallible((), || unsafe { drop_boxed(result.cast::<Vec<Output>>()) })
}
