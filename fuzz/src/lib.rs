//! Shared pieces of rtpu's fuzz targets: one runtime per process on the
//! real CPU plugin, error handling that turns a PANIC error into a crash,
//! and the ATen schemas `op_call` builds its arguments from.
//!
//! The targets call the `extern "C"` functions of the `rtpu` crate directly,
//! exactly as C would.

pub mod op_args;
pub mod schema;
pub mod tensors;

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use rtpu::error::{
    rtpu_error, rtpu_error_code, rtpu_error_destroy, rtpu_error_message,
    RTPU_ERROR_CODE_INVALID_ARGUMENT, RTPU_ERROR_CODE_OK, RTPU_ERROR_CODE_PANIC,
};
use rtpu::executable::{
    rtpu_compile_args, rtpu_executable, rtpu_executable_compile, RTPU_COMPILE_ARGS_STRUCT_SIZE,
};
use rtpu::runtime::{
    rtpu_runtime, rtpu_runtime_open, rtpu_runtime_open_args, RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE,
};

/// A runtime handle shared by every fuzz iteration of the process.
struct Runtime(*mut rtpu_runtime);

// SAFETY: rtpu's runtime handle is documented as thread-safe.
unsafe impl Send for Runtime {}
// SAFETY: as above.
unsafe impl Sync for Runtime {}

/// The process's runtime on `$RTPU_PLUGIN`, opened on first use. The disk
/// cache is off unless `RTPU_CACHE_DIR` is set: fuzzed programs do not
/// belong in the user's cache, and the disk would slow every iteration.
pub fn runtime() -> *const rtpu_runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            if std::env::var_os("RTPU_CACHE_DIR").is_none() {
                std::env::set_var("RTPU_CACHE_DIR", "");
            }
            let args = rtpu_runtime_open_args {
                struct_size: RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE,
                plugin_path: std::ptr::null(),
                options: std::ptr::null(),
                num_options: 0,
                key_value_store: std::ptr::null(),
            };
            let mut rt = std::ptr::null_mut();
            let outcome = take(rtpu_runtime_open(&args, &mut rt));
            if let Outcome::Failed { code, message } = outcome {
                // Not a finding: the fuzzer cannot run at all (no plugin).
                eprintln!("fuzz: cannot open a runtime ({code}): {message}");
                eprintln!("fuzz: set RTPU_PLUGIN (scripts/env.sh does) and retry");
                std::process::exit(2);
            }
            Runtime(rt)
        })
        .0
}

/// Compiles the StableHLO text `code` for one device on the process's
/// runtime: how the call ended, and the executable it wrote (the caller
/// destroys it).
pub fn compile(code: &[u8]) -> (Outcome, *mut rtpu_executable) {
    let args = rtpu_compile_args {
        struct_size: RTPU_COMPILE_ARGS_STRUCT_SIZE,
        code: code.as_ptr().cast(),
        code_size: code.len(),
        num_replicas: 1,
        num_partitions: 1,
        use_spmd_partitioning: false,
    };
    let mut exe = std::ptr::null_mut();
    let outcome = take(rtpu_executable_compile(runtime(), &args, &mut exe));
    (outcome, exe)
}

/// How an rtpu call ended.
#[derive(Debug)]
pub enum Outcome {
    Ok,
    Failed { code: u32, message: String },
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }

    /// Whether the call was refused as INVALID_ARGUMENT.
    pub fn is_invalid(&self) -> bool {
        matches!(self, Outcome::Failed { code, .. } if *code == RTPU_ERROR_CODE_INVALID_ARGUMENT)
    }
}

/// Takes ownership of an rtpu error: NULL is success; a PANIC error (a bug
/// in rtpu, caught at the boundary) is a crash for the fuzzer; any other
/// error is a valid answer to fuzzed input. Every error gets a message.
pub fn take(error: *mut rtpu_error) -> Outcome {
    if error.is_null() {
        return Outcome::Ok;
    }
    let code = rtpu_error_code(error);
    // SAFETY: the message lives until the error is destroyed, below.
    let message = unsafe { c_string(rtpu_error_message(error)) };
    rtpu_error_destroy(error);
    assert_ne!(code, RTPU_ERROR_CODE_PANIC, "rtpu panicked: {message}");
    assert_ne!(code, RTPU_ERROR_CODE_OK, "an error object with code OK");
    assert!(!message.is_empty(), "error {code} has no message");
    Outcome::Failed { code, message }
}

/// A C string rtpu handed out, copied; NULL reads as empty.
///
/// # Safety
/// A non-NULL `ptr` must be a NUL-terminated string that lives during the
/// call (as rtpu's returned strings do).
pub unsafe fn c_string(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// Whether `RTPU_FUZZ_VERBOSE` is set: then targets print each call and
/// its outcome to stderr (for replaying one input).
pub fn verbose() -> bool {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    *VERBOSE.get_or_init(|| std::env::var_os("RTPU_FUZZ_VERBOSE").is_some())
}
