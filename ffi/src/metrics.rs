//! rtpu's counters, by name: the list and its descriptions come from
//! `rtpu_core::metrics`, where each metric is declared once.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use rtpu_core::metrics;

use crate::boundary::{c_str, fallible, infallible, slice_mut, Out};
use crate::error::{rtpu_error, FfiError};

/// Each metric's name, unit and help as C strings, made once.
fn c_definitions() -> &'static [[CString; 3]] {
    static DEFINITIONS: OnceLock<Vec<[CString; 3]>> = OnceLock::new();
    DEFINITIONS.get_or_init(|| {
        metrics::definitions()
            .iter()
            .map(|d| {
                [d.name, d.unit.as_str(), d.help]
                    .map(|text| CString::new(text).expect("metric texts hold no NUL"))
            })
            .collect()
    })
}

/// How many metrics rtpu keeps; `rtpu_metric_*` take an index below it.
/// New metrics are only ever appended, so an index names the same metric
/// in every release of this ABI version. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_metric_count() -> usize {
    infallible(0, || metrics::definitions().len())
}

/// Describes metric `index`: `*name_out` is its stable snake_case name
/// (e.g. "ops_run"), `*unit_out` one of "count" (events since the process
/// started), "bytes", "ns" (time) or "live" (how many exist now), and
/// `*help_out` one line saying what it counts. The strings are static:
/// they live as long as the process. INVALID_ARGUMENT for an index past
/// `rtpu_metric_count()` or a NULL output. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_metric_describe(
    index: usize,
    name_out: *mut *const c_char,
    unit_out: *mut *const c_char,
    help_out: *mut *const c_char,
) -> *mut rtpu_error {
    fallible("rtpu_metric_describe", || {
        let name_out = Out::new(name_out, "name_out")?;
        let unit_out = Out::new(unit_out, "unit_out")?;
        let help_out = Out::new(help_out, "help_out")?;
        let [name, unit, help] = c_definitions().get(index).ok_or_else(|| {
            FfiError::invalid(format!(
                "metric index {index}: expected less than rtpu_metric_count() = {}",
                metrics::definitions().len()
            ))
        })?;
        name_out.write(name.as_ptr());
        unit_out.write(unit.as_ptr());
        help_out.write(help.as_ptr());
        Ok(())
    })
}

/// Writes to `*index_out` the index of the metric named `name`
/// (NUL-terminated, borrowed). NOT_FOUND when rtpu keeps no such metric.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_metric_find(name: *const c_char, index_out: *mut usize) -> *mut rtpu_error {
    fallible("rtpu_metric_find", || {
        // SAFETY: the caller passes a NUL-terminated string (NULL is refused).
        let name = unsafe { c_str(name, "name") }?;
        let index_out = Out::new(index_out, "index_out")?;
        let index = metrics::find(name).ok_or_else(|| {
            FfiError::new(
                crate::error::RTPU_ERROR_CODE_NOT_FOUND,
                format!("no metric is named \"{name}\""),
            )
        })?;
        index_out.write(index);
        Ok(())
    })
}

/// Reads the current values of the first `count` metrics into `values`
/// (`count` elements, caller-owned; at most `rtpu_metric_count()`, which
/// reads all). Each value is read atomically, the set not at one instant.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_metrics_read(values: *mut u64, count: usize) -> *mut rtpu_error {
    fallible("rtpu_metrics_read", || {
        let all = metrics::values();
        if count > all.len() {
            return Err(FfiError::invalid(format!(
                "count is {count}, more than rtpu_metric_count() = {}",
                all.len()
            )));
        }
        // SAFETY: the caller passes `count` writable u64s (NULL only for 0).
        let values = unsafe { slice_mut(values, count, "values") }?;
        values.copy_from_slice(&all[..count]);
        Ok(())
    })
}
