//! Loading PJRT plugins and calling into their API table.
//!
//! A plugin is loaded once per path per process and never unloaded: PJRT
//! plugins keep threads and static state that do not survive `dlclose`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::runtime::sys::{self, Args, PJRT_Api, PJRT_Error};

use crate::error::{Error, ErrorCode, Result};

/// A loaded, initialised PJRT plugin. Lives for the rest of the process.
#[derive(Debug)]
pub struct Plugin {
    path: PathBuf,
    api: &'static PJRT_Api,
}

// SAFETY: the PJRT API table is immutable after `GetPjrtApi` returns and every
// PJRT entry point is documented as callable from any thread.
unsafe impl Send for Plugin {}
// SAFETY: as above; `Plugin` holds no interior mutability.
unsafe impl Sync for Plugin {}

/// The environment variable naming the PJRT plugin to load.
pub const PLUGIN_ENV: &str = "RTPU_PLUGIN";

/// How to get a plugin, appended to every "no plugin" error.
pub const PLUGIN_INSTALL_HINT: &str = "install XLA's CPU plugin with `python3 -m pip install \
     xla-cpu-pjrt==0.0.1` and set RTPU_PLUGIN to \
     <site-packages>/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so (or point it at libtpu.so)";

/// The plugin path to use: `explicit` when given, else `$RTPU_PLUGIN`.
pub fn resolve_plugin_path(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    match std::env::var_os(PLUGIN_ENV) {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => Err(Error::NoPlugin {
            hint: PLUGIN_INSTALL_HINT,
        }),
    }
}

/// Loads the plugin at `path` (once per canonical path per process) and runs
/// `PJRT_Plugin_Initialize`. Later calls with the same path return the same plugin.
pub fn load(path: &Path) -> Result<&'static Plugin> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, &'static Plugin>>> = OnceLock::new();
    let canonical = path.canonicalize().map_err(|e| Error::PluginLoad {
        path: path.to_path_buf(),
        reason: format!("{e}; {PLUGIN_INSTALL_HINT}"),
    })?;
    // Holding the lock across dlopen keeps two threads from initialising the
    // same plugin twice.
    let mut loaded = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(plugin) = loaded.get(&canonical) {
        return Ok(plugin);
    }
    let plugin: &'static Plugin = Box::leak(Box::new(Plugin::open(&canonical)?));
    loaded.insert(canonical, plugin);
    Ok(plugin)
}

/// The PJRT C API version rtpu was compiled against.
pub const RTPU_PJRT_API_VERSION: (i32, i32) =
    (sys::PJRT_API_MAJOR as i32, sys::PJRT_API_MINOR as i32);

type GetPjrtApi = unsafe extern "C" fn() -> *const PJRT_Api;

impl Plugin {
    fn open(path: &Path) -> Result<Plugin> {
        let load_error = |reason: String| Error::PluginLoad {
            path: path.to_path_buf(),
            reason,
        };
        // SAFETY: loading a shared library runs its initialisers; a PJRT plugin's
        // are safe to run once, and `load` guarantees once per path.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| load_error(e.to_string()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api = unsafe { library.get::<GetPjrtApi>(b"GetPjrtApi\0") }
            .map_err(|e| load_error(format!("no GetPjrtApi symbol ({e})")))?;
        // SAFETY: the symbol was resolved from a PJRT plugin and takes no arguments.
        let api_ptr = unsafe { get_api() };
        // The library is never unloaded: the API table and the plugin's threads
        // must outlive every handle into it.
        std::mem::forget(library);
        if api_ptr.is_null() {
            return Err(load_error("GetPjrtApi returned NULL".into()));
        }
        // SAFETY: non-NULL, and the plugin keeps its API table alive forever.
        let api: &'static PJRT_Api = unsafe { &*api_ptr };

        let version_end = std::mem::offset_of!(PJRT_Api, pjrt_api_version)
            + std::mem::size_of::<sys::PJRT_Api_Version>();
        if api.struct_size < version_end {
            return Err(load_error(format!(
                "its PJRT_Api struct is {} bytes, too small to hold a version",
                api.struct_size
            )));
        }
        let version = api.pjrt_api_version;
        if version.major_version != RTPU_PJRT_API_VERSION.0 {
            return Err(Error::ApiVersionMismatch {
                path: path.to_path_buf(),
                plugin_major: version.major_version,
                plugin_minor: version.minor_version,
                rtpu_major: RTPU_PJRT_API_VERSION.0,
                rtpu_minor: RTPU_PJRT_API_VERSION.1,
            });
        }
        let plugin = Plugin {
            path: path.to_path_buf(),
            api,
        };
        let mut args = sys::PJRT_Plugin_Initialize_Args::new();
        // SAFETY: `args` is a valid, fully initialised args struct.
        unsafe { pjrt_call!(plugin, PJRT_Plugin_Initialize, &mut args) }?;
        Ok(plugin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's PJRT C API version, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        let v = self.api.pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    /// Looks up an API function that lives at `offset` in `PJRT_Api`, reading
    /// the field only when it lies inside the plugin's `struct_size`.
    pub(crate) fn function<F: Copy>(
        &self,
        name: &'static str,
        offset: usize,
        field: impl FnOnce(&PJRT_Api) -> Option<F>,
    ) -> Result<F> {
        let missing = || Error::MissingFunction {
            path: self.path.clone(),
            function: name,
        };
        if offset + std::mem::size_of::<Option<F>>() > self.api.struct_size {
            return Err(missing());
        }
        field(self.api).ok_or_else(missing)
    }

    /// Calls a PJRT function found by `function` and converts its error.
    ///
    /// # Safety
    /// `args` must satisfy the PJRT contract of the function: `struct_size` set
    /// and every pointer in it valid for the duration of the call.
    pub(crate) unsafe fn call<A>(
        &self,
        name: &'static str,
        f: unsafe extern "C" fn(*mut A) -> *mut PJRT_Error,
        args: &mut A,
    ) -> Result<()> {
        // SAFETY: the caller guarantees `args` is valid for `f`.
        let error = unsafe { f(args) };
        self.take_error(name, error)
    }

    /// Converts (and destroys) a `PJRT_Error` returned by the call `name`.
    pub(crate) fn take_error(&self, name: &'static str, error: *mut PJRT_Error) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        let mut message = String::from("(the plugin gave no message)");
        let mut code = ErrorCode::Unknown;

        let mut message_args = sys::PJRT_Error_Message_Args::new();
        message_args.error = error;
        if let Ok(f) = self.function(
            "PJRT_Error_Message",
            std::mem::offset_of!(PJRT_Api, PJRT_Error_Message),
            |a| a.PJRT_Error_Message,
        ) {
            // SAFETY: `error` is a live error from this plugin.
            unsafe { f(&mut message_args) };
            if !message_args.message.is_null() {
                // SAFETY: PJRT returns `message_size` bytes owned by the error,
                // valid until it is destroyed below.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        message_args.message.cast::<u8>(),
                        message_args.message_size,
                    )
                };
                message = String::from_utf8_lossy(bytes).into_owned();
            }
        }

        let mut code_args = sys::PJRT_Error_GetCode_Args::new();
        code_args.error = error;
        if let Ok(f) = self.function(
            "PJRT_Error_GetCode",
            std::mem::offset_of!(PJRT_Api, PJRT_Error_GetCode),
            |a| a.PJRT_Error_GetCode,
        ) {
            // SAFETY: `error` is a live error from this plugin.
            if unsafe { f(&mut code_args) }.is_null() {
                code = ErrorCode::from_raw(code_args.code);
            }
        }

        let mut destroy_args = sys::PJRT_Error_Destroy_Args::new();
        destroy_args.error = error;
        if let Ok(f) = self.function(
            "PJRT_Error_Destroy",
            std::mem::offset_of!(PJRT_Api, PJRT_Error_Destroy),
            |a| a.PJRT_Error_Destroy,
        ) {
            // SAFETY: `error` is live and destroyed exactly once, here.
            unsafe { f(&mut destroy_args) };
        }
        Err(Error::Pjrt {
            call: name,
            code,
            message,
        })
    }
}
