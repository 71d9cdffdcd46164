//! `rtpu_runtime`: a loaded plugin and its client, shared by reference count.

use std::ffi::{c_char, CString};
use std::path::Path;
use std::sync::Arc;

use rtpu_core::runtime::{self, Client, CreateOption, KeyValueStore};

use crate::boundary::{
    c_str, check_struct_size, fallible, infallible, non_null, out_ptr, release_arc, retain_arc,
    slice, Out,
};
use crate::error::{rtpu_error, FfiError};
use crate::key_value::{rtpu_key_value_store, CStore, RTPU_KEY_VALUE_STORE_STRUCT_SIZE};

/// A PJRT plugin with a client on it. Reference counted: `rtpu_runtime_open`
/// returns one reference; `rtpu_runtime_retain`/`_release` add and drop one.
/// Buffers and executables keep what they need alive on their own, so a
/// runtime may be released before them. Thread-safe.
pub struct rtpu_runtime {
    _private: [u8; 0],
}

/// The Rust side of `rtpu_runtime`.
pub(crate) struct Runtime {
    pub(crate) client: Client,
    platform_name: CString,
    platform_version: CString,
    devices: Vec<DeviceStrings>,
    global_device_count: usize,
    process_index: usize,
}

struct DeviceStrings {
    kind: CString,
    description: CString,
}

pub(crate) fn to_c_string(s: String) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

/// The value type of an `rtpu_named_value`.
pub const RTPU_VALUE_INT64: u32 = 0;
pub const RTPU_VALUE_INT64_LIST: u32 = 1;
pub const RTPU_VALUE_FLOAT: u32 = 2;
pub const RTPU_VALUE_BOOL: u32 = 3;
pub const RTPU_VALUE_STRING: u32 = 4;

/// A named client create option (e.g. `cpu_device_count` for the CPU plugin).
/// Only the field that `value_type` names is read.
#[repr(C)]
pub struct rtpu_named_value {
    /// NUL-terminated name. Required.
    pub name: *const c_char,
    /// One of `RTPU_VALUE_*`.
    pub value_type: u32,
    pub int64_value: i64,
    /// `int64_list_size` values; may be NULL when the size is 0.
    pub int64_list: *const i64,
    pub int64_list_size: usize,
    pub float_value: f32,
    pub bool_value: bool,
    /// NUL-terminated.
    pub string_value: *const c_char,
}

/// Arguments of `rtpu_runtime_open`.
#[repr(C)]
pub struct rtpu_runtime_open_args {
    /// Set to `RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE`.
    pub struct_size: usize,
    /// NUL-terminated path of a PJRT plugin (.so). NULL: use `$RTPU_PLUGIN`.
    pub plugin_path: *const c_char,
    /// `num_options` client create options; may be NULL when there are none.
    pub options: *const rtpu_named_value,
    pub num_options: usize,
    /// For one process of a job whose plugin runs collectives across
    /// processes (libtpu, XLA's CUDA plugin): the store the client finds its
    /// peers through, given with the create options `node_id` (this
    /// process, from 0) and `num_nodes` (int64), as JAX gives its
    /// distributed client's. Copied; its `context` is released when the
    /// runtime is freed, also when the open fails. NULL: none. The CPU
    /// plugins ignore it (their processes do not share collectives).
    pub key_value_store: *const rtpu_key_value_store,
}

/// `sizeof(rtpu_runtime_open_args)`; fields are only ever appended (32
/// bytes, without `key_value_store`, is still accepted).
pub const RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE: usize = 40;

/// The size of `rtpu_runtime_open_args` before `key_value_store`.
const OPEN_ARGS_V0_SIZE: usize = 32;

/// Per-device information filled by `rtpu_runtime_device_info`.
#[repr(C)]
pub struct rtpu_device_info {
    /// In: set to `RTPU_DEVICE_INFO_STRUCT_SIZE` by the caller.
    pub struct_size: usize,
    /// The device's global id.
    pub id: i32,
    /// NUL-terminated, e.g. "cpu"; owned by the runtime, valid while it lives.
    pub kind: *const c_char,
    /// NUL-terminated, e.g. "TFRT_CPU_0"; owned by the runtime.
    pub description: *const c_char,
    /// False when the plugin keeps no memory statistics (the CPU plugin).
    pub has_memory_stats: bool,
    pub bytes_in_use: i64,
    /// -1 when unknown.
    pub peak_bytes_in_use: i64,
    /// -1 when unknown.
    pub bytes_limit: i64,
}

/// `sizeof(rtpu_device_info)` in ABI v0.
pub const RTPU_DEVICE_INFO_STRUCT_SIZE: usize = 64;

/// Converts one C create option into the core's form.
///
/// # Safety
/// The pointers in `value` must be valid as its documentation says.
unsafe fn create_option(
    value: &rtpu_named_value,
    index: usize,
) -> Result<(String, CreateOption), FfiError> {
    // SAFETY: guaranteed by the caller.
    let name = unsafe { c_str(value.name, &format!("options[{index}].name")) }?.to_string();
    let option = match value.value_type {
        RTPU_VALUE_INT64 => CreateOption::Int(value.int64_value),
        // SAFETY: guaranteed by the caller.
        RTPU_VALUE_INT64_LIST => CreateOption::IntList(
            unsafe {
                slice(
                    value.int64_list,
                    value.int64_list_size,
                    &format!("options[{index}].int64_list"),
                )
            }?
            .to_vec(),
        ),
        RTPU_VALUE_FLOAT => CreateOption::Float(value.float_value),
        RTPU_VALUE_BOOL => CreateOption::Bool(value.bool_value),
        // SAFETY: guaranteed by the caller.
        RTPU_VALUE_STRING => CreateOption::Str(
            unsafe {
                c_str(
                    value.string_value,
                    &format!("options[{index}].string_value"),
                )
            }?
            .to_string(),
        ),
        other => {
            return Err(FfiError::invalid(format!(
                "options[{index}].value_type is {other}; expected one of RTPU_VALUE_*"
            )))
        }
    };
    Ok((name, option))
}

/// Loads a PJRT plugin and creates a client on it.
///
/// `args->plugin_path` names the plugin; when NULL, `$RTPU_PLUGIN` does. When
/// neither is set, or the file cannot be loaded, the error (NOT_FOUND) says
/// how to install XLA's CPU plugin. A plugin is loaded once per process and
/// never unloaded; opening it again creates another client.
///
/// On success `*runtime_out` holds one reference; drop it with
/// `rtpu_runtime_release`. `args` is only read during the call.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_open(
    args: *const rtpu_runtime_open_args,
    runtime_out: *mut *mut rtpu_runtime,
) -> *mut rtpu_error {
    fallible("rtpu_runtime_open", || {
        // SAFETY: a non-NULL `args` points to an args struct per the docs.
        let args = unsafe { non_null(args, "args") }?;
        let runtime_out = Out::new(runtime_out, "runtime_out")?;
        check_struct_size(
            "rtpu_runtime_open_args",
            args.struct_size,
            OPEN_ARGS_V0_SIZE,
        )?;
        // Taken over first, so its context is released whatever fails below.
        let store = if args.struct_size >= RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE
            && !args.key_value_store.is_null()
        {
            // SAFETY: a non-NULL table is readable per the docs.
            let table = unsafe { non_null(args.key_value_store, "args->key_value_store") }?;
            // A table shorter than the struct cannot be read, `release` included.
            check_struct_size(
                "rtpu_key_value_store",
                table.struct_size,
                RTPU_KEY_VALUE_STORE_STRUCT_SIZE,
            )?;
            Some(Arc::new(CStore::new(table).map_err(FfiError::invalid)?) as Arc<dyn KeyValueStore>)
        } else {
            None
        };
        let explicit = if args.plugin_path.is_null() {
            None
        } else {
            // SAFETY: documented as NUL-terminated.
            Some(unsafe { c_str(args.plugin_path, "args->plugin_path") }?)
        };
        // SAFETY: documented as `num_options` readable values.
        let raw_options = unsafe { slice(args.options, args.num_options, "args->options") }?;
        let options = raw_options
            .iter()
            .enumerate()
            // SAFETY: each value's pointers are valid per the docs.
            .map(|(i, v)| unsafe { create_option(v, i) })
            .collect::<Result<Vec<_>, _>>()?;
        let named: Vec<(&str, CreateOption)> = options
            .iter()
            .map(|(n, o)| (n.as_str(), o.clone()))
            .collect();

        let path = runtime::resolve_plugin_path(explicit.map(Path::new))?;
        let plugin = runtime::load(&path)?;
        let client = Client::create_with_store(plugin, &named, store)?;
        let devices = client
            .devices()
            .iter()
            .map(|d| {
                Ok(DeviceStrings {
                    kind: to_c_string(d.kind()?),
                    description: to_c_string(d.description_string()?),
                })
            })
            .collect::<Result<Vec<_>, rtpu_core::Error>>()?;
        let runtime = Runtime {
            platform_name: to_c_string(client.platform_name()?.to_string()),
            platform_version: to_c_string(client.platform_version()?),
            devices,
            global_device_count: client.global_device_count()?,
            process_index: client.process_index()?,
            client,
        };
        runtime_out.write(Arc::into_raw(Arc::new(runtime)).cast_mut().cast());
        Ok(())
    })
}

/// The `Runtime` behind a non-NULL handle.
///
/// # Safety
/// A non-NULL `runtime` must be a live handle from `rtpu_runtime_open`.
pub(crate) unsafe fn runtime_ref<'a>(
    runtime: *const rtpu_runtime,
) -> Result<&'a Runtime, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(runtime.cast::<Runtime>(), "runtime") }
}

/// The body of an export that reads `get` from a runtime and cannot fail:
/// `default` for a NULL runtime.
fn read_runtime<T: Copy>(
    runtime: *const rtpu_runtime,
    default: T,
    get: impl FnOnce(&Runtime) -> T,
) -> T {
    infallible(default, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { runtime_ref(runtime) }.map_or(default, get)
    })
}

/// Adds a reference. NULL is a no-op. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_retain(runtime: *const rtpu_runtime) {
    // SAFETY: a non-NULL handle is live, so it holds at least one reference.
    infallible((), || unsafe { retain_arc(runtime.cast::<Runtime>()) })
}

/// Drops a reference; the last one frees the runtime (its plugin stays
/// loaded). NULL is a no-op. Releasing more references than were taken is
/// undefined behaviour. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_release(runtime: *const rtpu_runtime) {
    // SAFETY: the caller gives up one reference it holds.
    infallible((), || unsafe { release_arc(runtime.cast::<Runtime>()) })
}

/// The platform name (e.g. "cpu", "tpu"): NUL-terminated, owned by the
/// runtime. NULL `runtime` gives NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_platform_name(runtime: *const rtpu_runtime) -> *const c_char {
    read_runtime(runtime, std::ptr::null(), |rt| rt.platform_name.as_ptr())
}

/// The platform version string: NUL-terminated, owned by the runtime. NULL
/// `runtime` gives NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_platform_version(runtime: *const rtpu_runtime) -> *const c_char {
    read_runtime(runtime, std::ptr::null(), |rt| rt.platform_version.as_ptr())
}

/// The number of devices this process can address. NULL `runtime` gives 0.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_device_count(runtime: *const rtpu_runtime) -> usize {
    read_runtime(runtime, 0, |rt| rt.client.device_count())
}

/// The number of devices of every process of the job, this one's included:
/// above `rtpu_runtime_device_count` when the plugin joined its peers
/// through a key-value store (see `rtpu_runtime_open_args`). Device ids
/// (`rtpu_device_info.id`) are global. NULL `runtime` gives 0. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_global_device_count(runtime: *const rtpu_runtime) -> usize {
    read_runtime(runtime, 0, |rt| rt.global_device_count)
}

/// This process's index among the processes of the job (the `node_id` it was
/// opened with; 0 alone). NULL `runtime` gives 0. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_process_index(runtime: *const rtpu_runtime) -> usize {
    read_runtime(runtime, 0, |rt| rt.process_index)
}

/// Reads the integer attribute `name` (NUL-terminated, e.g. "num_cores",
/// which TPU plugins report) of device `index`'s description: sets
/// `*found_out`, and `*value_out` when found. Attributes and their names are
/// the plugin's own; the CPU plugin reports none of them. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_device_int_attribute(
    runtime: *const rtpu_runtime,
    index: usize,
    name: *const c_char,
    found_out: *mut bool,
    value_out: *mut i64,
) -> *mut rtpu_error {
    fallible("rtpu_runtime_device_int_attribute", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        // SAFETY: a non-NULL name is NUL-terminated per the docs.
        let name = unsafe { c_str(name, "name") }?;
        let found_out = Out::new(found_out, "found_out")?;
        let value_out = Out::new(value_out, "value_out")?;
        let value = rt.client.device(index)?.int_attribute(name)?;
        found_out.write(value.is_some());
        if let Some(v) = value {
            value_out.write(v);
        }
        Ok(())
    })
}

/// Fills `*info_out` for device `index` (0-based, below
/// `rtpu_runtime_device_count`). The caller sets `info_out->struct_size`;
/// only fields within it are written, and only on success. Strings in it are
/// owned by the runtime. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_runtime_device_info(
    runtime: *const rtpu_runtime,
    index: usize,
    info_out: *mut rtpu_device_info,
) -> *mut rtpu_error {
    fallible("rtpu_runtime_device_info", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        let info_out = out_ptr(info_out, "info_out")?;
        // SAFETY: non-NULL and points to a caller-owned struct whose first
        // field is `struct_size`.
        let given = unsafe { (*info_out).struct_size };
        check_struct_size("rtpu_device_info", given, RTPU_DEVICE_INFO_STRUCT_SIZE)?;
        let device = rt.client.device(index)?;
        let strings = &rt.devices[index];
        let stats = device.memory_stats()?;
        let info = rtpu_device_info {
            struct_size: given,
            id: device.id()?,
            kind: strings.kind.as_ptr(),
            description: strings.description.as_ptr(),
            has_memory_stats: stats.is_some(),
            bytes_in_use: stats.map_or(0, |s| s.bytes_in_use),
            peak_bytes_in_use: stats.and_then(|s| s.peak_bytes_in_use).unwrap_or(-1),
            bytes_limit: stats.and_then(|s| s.bytes_limit).unwrap_or(-1),
        };
        // SAFETY: the caller's struct is at least the v0 size checked above.
        unsafe { info_out.write(info) };
        Ok(())
    })
}
