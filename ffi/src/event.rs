//! Events: points in a device's work, as a torch Event records them.
//! Programs on one device run in the order they were launched, so an event
//! marks everything launched on its device before it was recorded.

use rtpu_core::engine::work::Marker;

use crate::boundary::{drop_boxed, fallible, infallible, non_null, Out};
use crate::error::{rtpu_error, FfiError, RTPU_ERROR_CODE_FAILED_PRECONDITION};
use crate::runtime::{rtpu_runtime, runtime_ref};

/// A point in one device's work, made by `rtpu_event_record`. Owned by the
/// caller: free it with `rtpu_event_destroy`. Thread-safe.
pub struct rtpu_event {
    _private: [u8; 0],
}

/// The `Marker` behind a non-NULL handle.
///
/// # Safety
/// A non-NULL `event` must be a live handle from `rtpu_event_record`.
unsafe fn marker_ref<'a>(event: *const rtpu_event, what: &str) -> Result<&'a Marker, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(event.cast::<Marker>(), what) }
}

/// Records an event on device `device_index` of `runtime`: it marks every
/// program launched there so far (ops still pending in deferred mode are not
/// launched yet). On success the caller owns `*event_out`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_event_record(
    runtime: *const rtpu_runtime,
    device_index: usize,
    event_out: *mut *mut rtpu_event,
) -> *mut rtpu_error {
    fallible("rtpu_event_record", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        let event_out = Out::new(event_out, "event_out")?;
        let marker = Marker::new(&rt.client, device_index)?;
        event_out.write(Box::into_raw(Box::new(marker)).cast());
        Ok(())
    })
}

/// Writes to `*done_out` whether the work `event` marks has finished,
/// without waiting. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_event_query(
    event: *const rtpu_event,
    done_out: *mut bool,
) -> *mut rtpu_error {
    fallible("rtpu_event_query", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let marker = unsafe { marker_ref(event, "event") }?;
        let done_out = Out::new(done_out, "done_out")?;
        done_out.write(marker.finished_at()?.is_some());
        Ok(())
    })
}

/// Blocks until the work `event` marks has finished; returns the first
/// error of the programs it waited for. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_event_synchronize(event: *const rtpu_event) -> *mut rtpu_error {
    fallible("rtpu_event_synchronize", || {
        // SAFETY: a non-NULL handle is live per the docs.
        Ok(unsafe { marker_ref(event, "event") }?.wait()?)
    })
}

/// Writes to `*ms_out` the milliseconds from the point `start` marks to the
/// one `end` marks: from when the work before `start` had finished (or
/// `start` was recorded, if later) to the same for `end`; negative when
/// `end`'s point came first. FAILED_PRECONDITION while the work of either
/// has not finished. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_event_elapsed_ms(
    start: *const rtpu_event,
    end: *const rtpu_event,
    ms_out: *mut f64,
) -> *mut rtpu_error {
    fallible("rtpu_event_elapsed_ms", || {
        // SAFETY: non-NULL handles are live per the docs.
        let start = unsafe { marker_ref(start, "start") }?;
        // SAFETY: as above.
        let end = unsafe { marker_ref(end, "end") }?;
        let ms_out = Out::new(ms_out, "ms_out")?;
        let ms = start.elapsed_ms(end)?.ok_or_else(|| {
            FfiError::new(
                RTPU_ERROR_CODE_FAILED_PRECONDITION,
                "both events' work must have finished to time it (rtpu_event_query)",
            )
        })?;
        ms_out.write(ms);
        Ok(())
    })
}

/// Frees an event. NULL is a no-op.
#[no_mangle]
pub extern "C" fn rtpu_event_destroy(event: *mut rtpu_event) {
    // SAFETY: a non-NULL `event` came from `rtpu_event_record`; destroyed
    // once.
    infallible((), || unsafe { drop_boxed(event.cast::<Marker>()) })
}
