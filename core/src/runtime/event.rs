//! PJRT events: completion of transfers and executions.

use crate::runtime::sys::{self, Args, PJRT_Event};

use super::plugin::Plugin;
use crate::error::Result;

/// An owned `PJRT_Event`, destroyed on drop.
pub(crate) struct Event {
    plugin: &'static Plugin,
    raw: *mut PJRT_Event,
}

impl Event {
    /// Takes ownership of `raw`; NULL means "nothing to wait for".
    pub(crate) fn from_raw(plugin: &'static Plugin, raw: *mut PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then_some(Event { plugin, raw })
    }

    /// Blocks until the event is ready and returns the error it carries, if any.
    pub(crate) fn wait(self) -> Result<()> {
        let mut args = sys::PJRT_Event_Await_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin, PJRT_Event_Await, &mut args) }
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
