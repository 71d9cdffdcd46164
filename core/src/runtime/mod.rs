//! The PJRT runtime: plugins, clients, devices, buffers and executables.
//!
//! This is the only module of the core that calls into C. Every handle holds
//! an `Arc` of its client, so a client outlives its buffers and executables.

/// `pjrt_call!(plugin, PJRT_Name, &mut args)` looks up `PJRT_Name` within the
/// plugin's `struct_size` and calls it, turning a `PJRT_Error` into `Error`.
/// Expands to a call of an `unsafe fn`: the args must be valid for the call.
macro_rules! pjrt_call {
    ($plugin:expr, $name:ident, $args:expr) => {
        match $plugin.function(
            stringify!($name),
            ::std::mem::offset_of!($crate::runtime::sys::PJRT_Api, $name),
            |api| api.$name,
        ) {
            Ok(f) => $plugin.call(stringify!($name), f, $args),
            Err(e) => Err(e),
        }
    };
}

mod buffer;
mod client;
mod compile;
mod event;
mod executable;
pub mod host_cache;
mod key_value;
mod plugin;
pub(crate) mod sys;

pub use buffer::Buffer;
pub use client::{Client, CreateOption, Device, MemoryStats};
pub use compile::CompileOptions;
pub(crate) use event::Event;
pub(crate) use executable::Execution;
pub use executable::{Collectives, ExecuteOptions, LoadedExecutable, ParameterType};
pub use key_value::KeyValueStore;
pub use plugin::{
    load, resolve_plugin_path, Plugin, PLUGIN_ENV, PLUGIN_INSTALL_HINT, RTPU_PJRT_API_VERSION,
};
