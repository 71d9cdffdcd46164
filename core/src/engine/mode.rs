//! The execution mode: one state machine for the whole process (the
//! autograd engine runs backward ops on threads of its own, so a mode per
//! thread would miss them).
//!
//! Eager and Deferred switch by `deferred::set_deferred` (leaving Deferred
//! runs what is pending); `capture::begin` enters Capture from either, and
//! `capture::end` or `abandon` returns to the mode it came from. The mode
//! does not change during a capture.

use std::sync::atomic::{AtomicU8, Ordering};

pub use crate::builder::Mode;

static MODE: AtomicU8 = AtomicU8::new(Mode::Eager as u8);

/// The current mode.
pub fn current() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        m if m == Mode::Deferred as u8 => Mode::Deferred,
        m if m == Mode::Capture as u8 => Mode::Capture,
        _ => Mode::Eager,
    }
}

/// Whether ops are recorded rather than run (Deferred or Capture).
pub fn is_recording() -> bool {
    current() != Mode::Eager
}

/// Moves to `mode`, returning the mode it left. Only the transitions
/// above call it; what each needs done first (a flush) is theirs to do.
pub(super) fn enter(mode: Mode) -> Mode {
    let previous = current();
    MODE.store(mode as u8, Ordering::Relaxed);
    previous
}
