//! PJRT events: completion of transfers and executions.

use std::ffi::c_void;

use crate::runtime::sys::{self, Args, PJRT_Error, PJRT_Event};

use super::plugin::Plugin;
use crate::error::Result;

/// An owned `PJRT_Event`, destroyed on drop.
pub(crate) struct Event {
    plugin: &'static Plugin,
    raw: *mut PJRT_Event,
}

// SAFETY: PJRT events may be awaited, queried and given callbacks from any
// thread; `Event` only hands the raw pointer to those calls and to destroy.
unsafe impl Send for Event {}
// SAFETY: as above; no method mutates `Event` itself.
unsafe impl Sync for Event {}

/// What `on_ready` hands PJRT as `user_arg`: the callback and the plugin that
/// owns the error it is called with.
struct ReadyCallback {
    plugin: &'static Plugin,
    callback: Box<dyn FnOnce() + Send>,
}

/// The `PJRT_Event_OnReadyCallback` of `on_ready`: runs the boxed callback
/// once and destroys the error PJRT hands over.
unsafe extern "C" fn run_ready_callback(error: *mut PJRT_Error, user_arg: *mut c_void) {
    // SAFETY: `user_arg` is the `Box<ReadyCallback>` leaked by `on_ready`,
    // and PJRT calls this exactly once.
    let ready = unsafe { Box::from_raw(user_arg.cast::<ReadyCallback>()) };
    // The error, if any, surfaces where the event is awaited.
    let _ = ready.plugin.take_error("PJRT_Event_OnReady", error);
    // A panic must not unwind into the plugin.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(ready.callback));
}

impl Event {
    /// Takes ownership of `raw`; NULL means "nothing to wait for".
    pub(crate) fn from_raw(plugin: &'static Plugin, raw: *mut PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then_some(Event { plugin, raw })
    }

    /// Blocks until the event is ready and returns the error it carries, if any.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut args = sys::PJRT_Event_Await_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin, PJRT_Event_Await, &mut args) }
    }

    /// Whether the event is ready, without waiting.
    pub(crate) fn is_ready(&self) -> Result<bool> {
        let mut args = sys::PJRT_Event_IsReady_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin, PJRT_Event_IsReady, &mut args) }?;
        Ok(args.is_ready)
    }

    /// Runs `callback` once the event is ready: on a plugin thread, or on
    /// this one when it already is. The callback may outlive `self`.
    pub(crate) fn on_ready(&self, callback: Box<dyn FnOnce() + Send>) -> Result<()> {
        let user_arg = Box::into_raw(Box::new(ReadyCallback {
            plugin: self.plugin,
            callback,
        }));
        let mut args = sys::PJRT_Event_OnReady_Args::new();
        args.event = self.raw;
        args.callback = Some(run_ready_callback);
        args.user_arg = user_arg.cast();
        // SAFETY: `self.raw` is live; `run_ready_callback` takes `user_arg`
        // back exactly once when PJRT calls it.
        let registered = unsafe { pjrt_call!(self.plugin, PJRT_Event_OnReady, &mut args) };
        if registered.is_err() {
            // PJRT refused the callback and will never call it.
            // SAFETY: `user_arg` came from `Box::into_raw` above and was not taken.
            drop(unsafe { Box::from_raw(user_arg) });
        }
        registered
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Event_Destroy_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is live and destroyed exactly once, here. A failed
        // destroy leaks the event; there is nothing better to do in a destructor.
        let _ = unsafe { pjrt_call!(self.plugin, PJRT_Event_Destroy, &mut args) };
    }
}
