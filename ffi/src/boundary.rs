//! The panic boundary and the checks every export runs on C input.
//!
//! Every `extern "C"` body runs inside `fallible` or `infallible`: a Rust panic
//! becomes a PANIC error (or the function's default value), never an unwind
//! into C or an abort of the host process.

use std::any::Any;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::error::{rtpu_error, FfiError};

/// Runs a fallible export body: `Ok` → NULL, `Err` → an owned error, panic →
/// a PANIC error naming the function.
pub(crate) fn fallible(
    function: &'static str,
    body: impl FnOnce() -> Result<(), FfiError>,
) -> *mut rtpu_error {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(error)) => error.into_raw(),
        Err(payload) => FfiError::panic(function, panic_message(payload.as_ref())).into_raw(),
    }
}

/// Runs an export body that cannot report errors; a panic yields `default`.
pub(crate) fn infallible<T>(default: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(default)
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// A shared reference to `*ptr`, or INVALID_ARGUMENT naming `what` when NULL.
///
/// # Safety
/// A non-NULL `ptr` must point to a live `T` for the returned lifetime.
pub(crate) unsafe fn non_null<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, FfiError> {
    // SAFETY: guaranteed by the caller when non-NULL.
    unsafe { ptr.as_ref() }.ok_or_else(|| FfiError::null(what))
}

/// Checks an out-pointer for NULL before any work is done.
pub(crate) fn out_ptr<T>(ptr: *mut T, what: &str) -> Result<*mut T, FfiError> {
    if ptr.is_null() {
        Err(FfiError::null(what))
    } else {
        Ok(ptr)
    }
}

/// A caller's out-parameter for one value: checked for NULL before any work
/// is done, written once the call has succeeded ("no partial successes").
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// INVALID_ARGUMENT naming `what` when `ptr` is NULL. Only for pointers
    /// an export's contract makes writable for one `T`.
    pub(crate) fn new(ptr: *mut T, what: &str) -> Result<Out<T>, FfiError> {
        out_ptr(ptr, what).map(Out)
    }

    pub(crate) fn write(self, value: T) {
        // SAFETY: non-NULL (checked in `new`) and writable per the contract
        // of the export that was given it.
        unsafe { self.0.write(value) }
    }
}

/// Frees a handle made from a `Box<T>`; NULL is a no-op.
///
/// # Safety
/// A non-NULL `handle` must come from `Box::<T>::into_raw` and not be used
/// again.
pub(crate) unsafe fn drop_boxed<T>(handle: *mut T) {
    if !handle.is_null() {
        // SAFETY: guaranteed by the caller.
        drop(unsafe { Box::from_raw(handle) });
    }
}

/// Adds a reference to the `Arc<T>` behind a handle; NULL is a no-op.
///
/// # Safety
/// A non-NULL `handle` must come from `Arc::<T>::into_raw` and hold a
/// reference.
pub(crate) unsafe fn retain_arc<T>(handle: *const T) {
    if !handle.is_null() {
        // SAFETY: guaranteed by the caller.
        unsafe { Arc::increment_strong_count(handle) };
    }
}

/// Drops a reference to the `Arc<T>` behind a handle (the last frees it);
/// NULL is a no-op.
///
/// # Safety
/// A non-NULL `handle` must come from `Arc::<T>::into_raw`, and the caller
/// gives up one reference it holds.
pub(crate) unsafe fn release_arc<T>(handle: *const T) {
    if !handle.is_null() {
        // SAFETY: guaranteed by the caller.
        unsafe { Arc::decrement_strong_count(handle) };
    }
}

/// Checks an args struct's `struct_size` against this library's v0 size.
pub(crate) fn check_struct_size(what: &str, given: usize, minimum: usize) -> Result<(), FfiError> {
    if given < minimum {
        return Err(FfiError::invalid(format!(
            "{what}.struct_size is {given}, smaller than the {minimum} bytes of ABI v0; set it to the \
             header's {what} size macro"
        )));
    }
    Ok(())
}

/// Calls an embedder's C function that returns 0 or a nonzero status with a
/// NUL-terminated message in the error buffer it is given: the status and
/// message on failure.
pub(crate) fn call_with_error_buffer(
    f: impl FnOnce(*mut c_char, usize) -> i32,
) -> Result<(), (i32, String)> {
    let mut error = [0u8; 512];
    // One byte is kept back, so an embedder that fills the buffer still
    // leaves it NUL-terminated.
    let status = f(error.as_mut_ptr().cast(), error.len() - 1);
    if status == 0 {
        return Ok(());
    }
    let message = CStr::from_bytes_until_nul(&error)
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    Err((status, message))
}

/// Whether a (pointer, length) pair addresses any elements: not for length
/// 0 (whatever the pointer); NULL with a length is INVALID_ARGUMENT.
fn has_elements(is_null: bool, len: usize, what: &str) -> Result<bool, FfiError> {
    if is_null && len != 0 {
        return Err(FfiError::invalid(format!(
            "{what} is NULL but its length is {len}"
        )));
    }
    Ok(len != 0)
}

/// A slice from a (pointer, length) pair; NULL is allowed only for length 0.
///
/// # Safety
/// A non-NULL `ptr` must point to `len` readable `T`s for the returned lifetime.
pub(crate) unsafe fn slice<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
) -> Result<&'a [T], FfiError> {
    if !has_elements(ptr.is_null(), len, what)? {
        return Ok(&[]);
    }
    // SAFETY: non-NULL, and `len` elements by the caller's guarantee.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A mutable slice from a (pointer, length) pair; NULL is allowed only for
/// length 0.
///
/// # Safety
/// A non-NULL `ptr` must point to `len` writable `T`s for the returned
/// lifetime, aliased by nothing else.
pub(crate) unsafe fn slice_mut<'a, T>(
    ptr: *mut T,
    len: usize,
    what: &str,
) -> Result<&'a mut [T], FfiError> {
    if !has_elements(ptr.is_null(), len, what)? {
        return Ok(&mut []);
    }
    // SAFETY: non-NULL, and `len` unaliased elements by the caller's guarantee.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// A UTF-8 string from a NUL-terminated C string.
///
/// # Safety
/// A non-NULL `ptr` must point to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, FfiError> {
    if ptr.is_null() {
        return Err(FfiError::null(what));
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| FfiError::invalid(format!("{what} is not valid UTF-8")))
}
