//! Error objects handed to C: a code and a NUL-terminated message.

use std::ffi::{c_char, CString};

use rtpu_core::{Error, ErrorCode};

use crate::boundary::{drop_boxed, infallible};

/// An error returned by a fallible rtpu call. Owned by the caller, who must
/// pass it to `rtpu_error_destroy`.
pub struct rtpu_error {
    _private: [u8; 0],
}

/// Success; never carried by an `rtpu_error` (success is a NULL error).
pub const RTPU_ERROR_CODE_OK: u32 = 0;
pub const RTPU_ERROR_CODE_CANCELLED: u32 = 1;
pub const RTPU_ERROR_CODE_UNKNOWN: u32 = 2;
/// NULL, out-of-range or inconsistent input from the caller.
pub const RTPU_ERROR_CODE_INVALID_ARGUMENT: u32 = 3;
pub const RTPU_ERROR_CODE_DEADLINE_EXCEEDED: u32 = 4;
/// E.g. no plugin was found.
pub const RTPU_ERROR_CODE_NOT_FOUND: u32 = 5;
pub const RTPU_ERROR_CODE_ALREADY_EXISTS: u32 = 6;
pub const RTPU_ERROR_CODE_PERMISSION_DENIED: u32 = 7;
pub const RTPU_ERROR_CODE_RESOURCE_EXHAUSTED: u32 = 8;
/// E.g. a plugin whose PJRT API major version differs from rtpu's.
pub const RTPU_ERROR_CODE_FAILED_PRECONDITION: u32 = 9;
pub const RTPU_ERROR_CODE_ABORTED: u32 = 10;
pub const RTPU_ERROR_CODE_OUT_OF_RANGE: u32 = 11;
/// The plugin (or rtpu) does not implement the request.
pub const RTPU_ERROR_CODE_UNIMPLEMENTED: u32 = 12;
pub const RTPU_ERROR_CODE_INTERNAL: u32 = 13;
pub const RTPU_ERROR_CODE_UNAVAILABLE: u32 = 14;
pub const RTPU_ERROR_CODE_DATA_LOSS: u32 = 15;
pub const RTPU_ERROR_CODE_UNAUTHENTICATED: u32 = 16;
/// rtpu panicked inside the call (a bug in rtpu). The process is intact and
/// the handles passed to the call remain valid to destroy.
pub const RTPU_ERROR_CODE_PANIC: u32 = 100;

/// The Rust side of `rtpu_error`.
#[derive(Debug)]
pub(crate) struct FfiError {
    code: u32,
    message: CString,
}

impl FfiError {
    pub(crate) fn new(code: u32, message: impl Into<String>) -> FfiError {
        let mut message = message.into();
        // A C string cannot hold NUL; keep the rest of the message readable.
        message.retain(|c| c != '\0');
        FfiError {
            code,
            message: CString::new(message).unwrap_or_default(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> FfiError {
        FfiError::new(RTPU_ERROR_CODE_INVALID_ARGUMENT, message)
    }

    pub(crate) fn null(what: &str) -> FfiError {
        FfiError::invalid(format!("{what} is NULL"))
    }

    /// This error about a field, named from its parent `parent`:
    /// "sizes is NULL" within "args[1].tensor" reads "args[1].tensor.sizes
    /// is NULL". Lets a hot path name fields without formatting their full
    /// path unless something is wrong.
    pub(crate) fn within(self, parent: &str) -> FfiError {
        FfiError {
            code: self.code,
            message: CString::new(format!("{parent}.{}", self.message.to_string_lossy()))
                .unwrap_or_default(),
        }
    }

    pub(crate) fn panic(function: &str, message: String) -> FfiError {
        FfiError::new(
            RTPU_ERROR_CODE_PANIC,
            format!("rtpu panicked in {function}: {message}"),
        )
    }

    pub(crate) fn into_raw(self) -> *mut rtpu_error {
        Box::into_raw(Box::new(self)).cast()
    }
}

impl From<Error> for FfiError {
    fn from(error: Error) -> FfiError {
        let code = match error.code() {
            ErrorCode::Cancelled => RTPU_ERROR_CODE_CANCELLED,
            ErrorCode::InvalidArgument => RTPU_ERROR_CODE_INVALID_ARGUMENT,
            ErrorCode::DeadlineExceeded => RTPU_ERROR_CODE_DEADLINE_EXCEEDED,
            ErrorCode::NotFound => RTPU_ERROR_CODE_NOT_FOUND,
            ErrorCode::AlreadyExists => RTPU_ERROR_CODE_ALREADY_EXISTS,
            ErrorCode::PermissionDenied => RTPU_ERROR_CODE_PERMISSION_DENIED,
            ErrorCode::ResourceExhausted => RTPU_ERROR_CODE_RESOURCE_EXHAUSTED,
            ErrorCode::FailedPrecondition => RTPU_ERROR_CODE_FAILED_PRECONDITION,
            ErrorCode::Aborted => RTPU_ERROR_CODE_ABORTED,
            ErrorCode::OutOfRange => RTPU_ERROR_CODE_OUT_OF_RANGE,
            ErrorCode::Unimplemented => RTPU_ERROR_CODE_UNIMPLEMENTED,
            ErrorCode::Internal => RTPU_ERROR_CODE_INTERNAL,
            ErrorCode::Unavailable => RTPU_ERROR_CODE_UNAVAILABLE,
            ErrorCode::DataLoss => RTPU_ERROR_CODE_DATA_LOSS,
            ErrorCode::Unauthenticated => RTPU_ERROR_CODE_UNAUTHENTICATED,
            _ => RTPU_ERROR_CODE_UNKNOWN,
        };
        FfiError::new(code, error.to_string())
    }
}

/// The error's code, one of `RTPU_ERROR_CODE_*`.
///
/// NULL `error` (success) gives `RTPU_ERROR_CODE_OK`. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_error_code(error: *const rtpu_error) -> u32 {
    infallible(RTPU_ERROR_CODE_INTERNAL, || {
        // SAFETY: a non-NULL error was returned by rtpu and not yet destroyed.
        match unsafe { error.cast::<FfiError>().as_ref() } {
            Some(e) => e.code,
            None => RTPU_ERROR_CODE_OK,
        }
    })
}

/// The error's message: NUL-terminated UTF-8, owned by `error` and valid until
/// `rtpu_error_destroy(error)`.
///
/// NULL `error` gives an empty string (static). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_error_message(error: *const rtpu_error) -> *const c_char {
    infallible(c"".as_ptr(), || {
        // SAFETY: a non-NULL error was returned by rtpu and not yet destroyed.
        match unsafe { error.cast::<FfiError>().as_ref() } {
            Some(e) => e.message.as_ptr(),
            None => c"".as_ptr(),
        }
    })
}

/// Frees an error. NULL is a no-op. Destroying the same error twice is
/// undefined behaviour, as with `free`.
#[no_mangle]
pub extern "C" fn rtpu_error_destroy(error: *mut rtpu_error) {
    // SAFETY: a non-NULL `error` came from `FfiError::into_raw`; destroyed
    // once.
    infallible((), || unsafe { drop_boxed(error.cast::<FfiError>()) })
}
