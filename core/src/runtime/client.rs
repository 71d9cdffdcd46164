//! PJRT clients and their devices.

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;

use crate::runtime::sys::{self, Args, PJRT_Client, PJRT_Device, PJRT_DeviceDescription};

use super::host_cache;
use super::key_value::{KeyValueStore, StoreCallbacks};
use super::plugin::Plugin;
use crate::error::{Error, ErrorCode, Result};

/// A value for a named client create option (e.g. the CPU plugin's
/// `cpu_device_count`).
#[derive(Clone, Debug, PartialEq)]
pub enum CreateOption {
    Int(i64),
    IntList(Vec<i64>),
    Str(String),
    Float(f32),
    Bool(bool),
}

/// A PJRT client: one per plugin and process in practice. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: &'static Plugin,
    pub(crate) raw: *mut PJRT_Client,
    devices: Vec<*mut PJRT_Device>,
    /// The platform name, read once: every op asks.
    platform_name: std::sync::OnceLock<String>,
    /// The store the plugin may call back into for the client's lifetime;
    /// dropped after the client (fields drop after `drop`).
    _store: Option<Box<StoreCallbacks>>,
}

// SAFETY: PJRT clients are thread-safe; the raw pointers are only handed to
// PJRT, never dereferenced here.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Tearing down a plugin client while unwinding risks a second panic or
        // an abort inside C++; leaking it is the safe choice then.
        if std::thread::panicking() {
            return;
        }
        let mut args = sys::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // SAFETY: `raw` is a live client; every child handle holds an `Arc` of
        // this struct, so none outlives it.
        let _ = unsafe { pjrt_call!(self.plugin, PJRT_Client_Destroy, &mut args) };
    }
}

impl Client {
    /// Creates a client with named create options.
    pub fn create(plugin: &'static Plugin, options: &[(&str, CreateOption)]) -> Result<Client> {
        Client::create_with_store(plugin, options, None)
    }

    /// Creates a client with named create options and, for plugins that find
    /// their peers through one (with the `node_id` and `num_nodes` options),
    /// a key-value store shared by the processes of the job.
    pub fn create_with_store(
        plugin: &'static Plugin,
        options: &[(&str, CreateOption)],
        store: Option<Arc<dyn KeyValueStore>>,
    ) -> Result<Client> {
        // The NamedValues point into `names` and `lists`, which outlive the call.
        let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
        let strings: Vec<CString> = options
            .iter()
            .map(|(name, value)| match value {
                CreateOption::Str(s) => CString::new(s.as_str()).map_err(|_| {
                    Error::invalid(
                        format!("create option {name}"),
                        "a string without NUL",
                        "an embedded NUL",
                    )
                }),
                _ => Ok(CString::default()),
            })
            .collect::<Result<_>>()?;
        let mut values = Vec::with_capacity(options.len());
        for (i, (_, value)) in options.iter().enumerate() {
            let mut v = sys::PJRT_NamedValue::new();
            v.name = names[i].as_ptr().cast();
            v.name_size = names[i].len();
            match value {
                CreateOption::Int(x) => {
                    v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
                    v.__bindgen_anon_1.int64_value = *x;
                    v.value_size = 1;
                }
                CreateOption::IntList(xs) => {
                    v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64List;
                    v.__bindgen_anon_1.int64_array_value = xs.as_ptr();
                    v.value_size = xs.len();
                }
                CreateOption::Str(s) => {
                    v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kString;
                    v.__bindgen_anon_1.string_value = strings[i].as_ptr();
                    v.value_size = s.len();
                }
                CreateOption::Float(x) => {
                    v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kFloat;
                    v.__bindgen_anon_1.float_value = *x;
                    v.value_size = 1;
                }
                CreateOption::Bool(x) => {
                    v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kBool;
                    v.__bindgen_anon_1.bool_value = *x;
                    v.value_size = 1;
                }
            }
            values.push(v);
        }
        let mut args = sys::PJRT_Client_Create_Args::new();
        args.create_options = values.as_ptr();
        args.num_options = values.len();
        let store = store.map(StoreCallbacks::new);
        if let Some(callbacks) = &store {
            callbacks.install(&mut args);
        }
        // SAFETY: `values` and everything it points to outlive the call; the
        // store's callbacks outlive the client (ClientInner keeps them).
        unsafe { pjrt_call!(plugin, PJRT_Client_Create, &mut args) }?;
        let mut inner = ClientInner {
            plugin,
            raw: args.client,
            devices: Vec::new(),
            platform_name: std::sync::OnceLock::new(),
            _store: store,
        };

        let mut dev_args = sys::PJRT_Client_AddressableDevices_Args::new();
        dev_args.client = inner.raw;
        // SAFETY: `inner.raw` is the live client just created.
        unsafe { pjrt_call!(plugin, PJRT_Client_AddressableDevices, &mut dev_args) }?;
        if dev_args.num_addressable_devices > 0 {
            // SAFETY: PJRT returns an array of `num_addressable_devices` device
            // pointers owned by the client.
            inner.devices = unsafe {
                std::slice::from_raw_parts(
                    dev_args.addressable_devices,
                    dev_args.num_addressable_devices,
                )
            }
            .to_vec();
        }
        let client = Client {
            inner: Arc::new(inner),
        };
        // On the CPU plugin device memory is the host's: cache its large
        // blocks. An optimisation only, so a plugin that cannot name its
        // platform still gets its client.
        if client.platform_name().is_ok_and(|name| name == "cpu") {
            host_cache::install(plugin.path());
        }
        Ok(client)
    }

    /// Identifies the client (equal for clones) for caches keyed by client.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    pub fn plugin(&self) -> &'static Plugin {
        self.inner.plugin
    }

    /// The platform name, e.g. `cpu`, `tpu`, `cuda`; asked once per client.
    pub fn platform_name(&self) -> Result<&str> {
        if let Some(name) = self.inner.platform_name.get() {
            return Ok(name);
        }
        let mut args = sys::PJRT_Client_PlatformName_Args::new();
        args.client = self.inner.raw;
        // SAFETY: live client.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_PlatformName, &mut args) }?;
        // SAFETY: PJRT returns a string owned by the client.
        let name = unsafe { owned_string(args.platform_name, args.platform_name_size) };
        Ok(self.inner.platform_name.get_or_init(|| name))
    }

    pub fn platform_version(&self) -> Result<String> {
        let mut args = sys::PJRT_Client_PlatformVersion_Args::new();
        args.client = self.inner.raw;
        // SAFETY: live client.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_PlatformVersion, &mut args) }?;
        // SAFETY: PJRT returns a string owned by the client.
        Ok(unsafe { owned_string(args.platform_version, args.platform_version_size) })
    }

    /// The devices this process can address, in the plugin's order.
    pub fn devices(&self) -> Vec<Device> {
        (0..self.inner.devices.len())
            .map(|i| Device {
                client: self.inner.clone(),
                raw: self.inner.devices[i],
            })
            .collect()
    }

    pub fn device_count(&self) -> usize {
        self.inner.devices.len()
    }

    /// The devices of every process of the job (this one's included): more
    /// than `device_count` when a plugin joined its peers through a
    /// key-value store.
    pub fn global_device_count(&self) -> Result<usize> {
        let mut args = sys::PJRT_Client_Devices_Args::new();
        args.client = self.inner.raw;
        // SAFETY: live client.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_Devices, &mut args) }?;
        Ok(args.num_devices)
    }

    /// This process's index among the processes of the job (0 alone).
    pub fn process_index(&self) -> Result<usize> {
        let mut args = sys::PJRT_Client_ProcessIndex_Args::new();
        args.client = self.inner.raw;
        // SAFETY: live client.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_ProcessIndex, &mut args) }?;
        usize::try_from(args.process_index)
            .map_err(|_| Error::invalid("the plugin's process index", "≥ 0", args.process_index))
    }

    /// The addressable device at `index`, or INVALID_ARGUMENT.
    pub fn device(&self, index: usize) -> Result<Device> {
        let count = self.device_count();
        let raw =
            *self.inner.devices.get(index).ok_or_else(|| {
                Error::invalid("device index", format!("less than {count}"), index)
            })?;
        Ok(Device {
            client: self.inner.clone(),
            raw,
        })
    }

    pub(crate) fn from_inner(inner: Arc<ClientInner>) -> Client {
        Client { inner }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin.path())
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

/// Copies a PJRT-owned (pointer, length) string.
///
/// # Safety
/// `ptr` must be NULL or point to `len` readable bytes.
pub(crate) unsafe fn owned_string(ptr: *const std::os::raw::c_char, len: usize) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// A device of a client. Holds its client alive.
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut PJRT_Device,
}

// SAFETY: PJRT device handles are immutable and usable from any thread.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// Memory statistics of a device; fields the plugin does not report are `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: Option<i64>,
    pub num_allocs: Option<i64>,
    pub largest_alloc_size: Option<i64>,
    pub bytes_limit: Option<i64>,
}

impl Device {
    fn description(&self) -> Result<*mut PJRT_DeviceDescription> {
        let mut args = sys::PJRT_Device_GetDescription_Args::new();
        args.device = self.raw;
        // SAFETY: live device of a live client.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Device_GetDescription, &mut args) }?;
        Ok(args.device_description)
    }

    /// The device's global id.
    pub fn id(&self) -> Result<i32> {
        let mut args = sys::PJRT_DeviceDescription_Id_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description belongs to this live device.
        unsafe { pjrt_call!(self.client.plugin, PJRT_DeviceDescription_Id, &mut args) }?;
        Ok(args.id)
    }

    /// The device kind, e.g. `cpu` or `TPU v5 lite`.
    pub fn kind(&self) -> Result<String> {
        let mut args = sys::PJRT_DeviceDescription_Kind_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description belongs to this live device.
        unsafe { pjrt_call!(self.client.plugin, PJRT_DeviceDescription_Kind, &mut args) }?;
        // SAFETY: PJRT returns a string owned by the description.
        Ok(unsafe { owned_string(args.device_kind, args.device_kind_size) })
    }

    /// The integer attribute `name` of the device's description (TPUs
    /// report `num_cores`, `core_on_chip`), or `None` when the plugin does
    /// not report it.
    pub fn int_attribute(&self, name: &str) -> Result<Option<i64>> {
        let mut args = sys::PJRT_DeviceDescription_Attributes_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description belongs to this live device.
        unsafe {
            pjrt_call!(
                self.client.plugin,
                PJRT_DeviceDescription_Attributes,
                &mut args
            )
        }?;
        if args.attributes.is_null() {
            return Ok(None);
        }
        // SAFETY: PJRT returns `num_attributes` values owned by the
        // description, which lives as long as the device.
        let attributes =
            unsafe { std::slice::from_raw_parts(args.attributes, args.num_attributes) };
        Ok(attributes.iter().find_map(|a| {
            // SAFETY: each name is `name_size` bytes owned by the description.
            let key = unsafe { std::slice::from_raw_parts(a.name.cast::<u8>(), a.name_size) };
            let is_int = a.type_ == sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
            if key != name.as_bytes() || !is_int {
                return None;
            }
            // SAFETY: a kInt64 value holds `int64_value`.
            Some(unsafe { a.__bindgen_anon_1.int64_value })
        }))
    }

    /// A short human-readable description, e.g. `TFRT_CPU_0`.
    pub fn description_string(&self) -> Result<String> {
        let mut args = sys::PJRT_DeviceDescription_ToString_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description belongs to this live device.
        unsafe {
            pjrt_call!(
                self.client.plugin,
                PJRT_DeviceDescription_ToString,
                &mut args
            )
        }?;
        // SAFETY: PJRT returns a string owned by the description.
        Ok(unsafe { owned_string(args.to_string, args.to_string_size) })
    }

    /// Memory statistics, or `None` when the plugin does not keep them
    /// (the CPU plugin does not).
    pub fn memory_stats(&self) -> Result<Option<MemoryStats>> {
        let mut args = sys::PJRT_Device_MemoryStats_Args::new();
        args.device = self.raw;
        // SAFETY: live device of a live client.
        match unsafe { pjrt_call!(self.client.plugin, PJRT_Device_MemoryStats, &mut args) } {
            Ok(()) => {}
            Err(e) if e.code() == ErrorCode::Unimplemented => return Ok(None),
            Err(e) => return Err(e),
        }
        let set = |value: i64, is_set: bool| is_set.then_some(value);
        Ok(Some(MemoryStats {
            bytes_in_use: args.bytes_in_use,
            peak_bytes_in_use: set(args.peak_bytes_in_use, args.peak_bytes_in_use_is_set),
            num_allocs: set(args.num_allocs, args.num_allocs_is_set),
            largest_alloc_size: set(args.largest_alloc_size, args.largest_alloc_size_is_set),
            bytes_limit: set(args.bytes_limit, args.bytes_limit_is_set),
        }))
    }

    pub fn client(&self) -> Client {
        Client::from_inner(self.client.clone())
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.description_string() {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "Device({:p})", self.raw),
        }
    }
}
