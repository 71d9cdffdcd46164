//! The one error type of the core. Every PJRT error is carried with PJRT's own
//! code and message; everything the core itself rejects has a structured variant.

use std::fmt;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Error codes, numbered as PJRT's (and absl's) status codes so a plugin's
/// code passes through unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl ErrorCode {
    /// Maps a raw PJRT/absl code; codes this build does not know become `Unknown`.
    pub fn from_raw(code: u32) -> ErrorCode {
        use ErrorCode::*;
        match code {
            1 => Cancelled,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            _ => Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Cancelled => "CANCELLED",
            Unknown => "UNKNOWN",
            InvalidArgument => "INVALID_ARGUMENT",
            DeadlineExceeded => "DEADLINE_EXCEEDED",
            NotFound => "NOT_FOUND",
            AlreadyExists => "ALREADY_EXISTS",
            PermissionDenied => "PERMISSION_DENIED",
            ResourceExhausted => "RESOURCE_EXHAUSTED",
            FailedPrecondition => "FAILED_PRECONDITION",
            Aborted => "ABORTED",
            OutOfRange => "OUT_OF_RANGE",
            Unimplemented => "UNIMPLEMENTED",
            Internal => "INTERNAL",
            Unavailable => "UNAVAILABLE",
            DataLoss => "DATA_LOSS",
            Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A PJRT call returned an error; `code` and `message` are the plugin's.
    #[error("{call}: {message}")]
    Pjrt {
        call: &'static str,
        code: ErrorCode,
        message: String,
    },

    #[error("no PJRT plugin given: {hint}")]
    NoPlugin { hint: &'static str },

    #[error("cannot load PJRT plugin {path}: {reason}")]
    PluginLoad { path: PathBuf, reason: String },

    #[error(
        "PJRT plugin {path} implements PJRT C API {plugin_major}.{plugin_minor}, but rtpu \
         was built against {rtpu_major}.{rtpu_minor}; the major versions must match"
    )]
    ApiVersionMismatch {
        path: PathBuf,
        plugin_major: i32,
        plugin_minor: i32,
        rtpu_major: i32,
        rtpu_minor: i32,
    },

    /// The plugin's API struct ends before this function, or leaves it NULL.
    #[error("PJRT plugin {path} does not implement {function}")]
    MissingFunction {
        path: PathBuf,
        function: &'static str,
    },

    /// A caller-supplied value is out of range or inconsistent with another.
    #[error("{what}: expected {expected}, got {got}")]
    InvalidArgument {
        what: String,
        expected: String,
        got: String,
    },

    /// An op this lowering does not cover for these arguments (a complex
    /// input to a real-only formula); the shim runs such calls on the CPU.
    #[error("{op} has no tpu lowering for {what}")]
    NotLowered { op: String, what: String },

    #[error("unknown dtype {name:?}")]
    UnknownDType { name: String },

    #[error("PJRT buffer type {raw} has no rtpu dtype")]
    UnsupportedBufferType { raw: u32 },

    /// Running a deferred graph failed; `ops` names what it recorded and
    /// where, `culprit` the op the failure points at when it is known.
    #[error("the deferred graph flushed at {site} ({ops}) failed{culprit}: {message}")]
    DeferredGraph {
        site: String,
        ops: String,
        culprit: String,
        code: ErrorCode,
        message: String,
    },

    /// More bytes than the device can hold (`bytes` is None past 2^64).
    #[error("{what} needs {}, more than the {capacity} bytes of tpu:{device}", bytes.map_or("more than 2^64 bytes".to_string(), |b| format!("{b} bytes")))]
    OutOfMemory {
        what: String,
        bytes: Option<u64>,
        capacity: u64,
        device: usize,
    },

    /// A tensor whose value a failed deferred graph was to compute.
    #[error("this tensor has no value: {message}")]
    LostValue { code: ErrorCode, message: String },

    /// A collective failed on every rank: ranks that disagreed, one that
    /// never came, or the program's own failure.
    #[error("{message}")]
    Collective { code: ErrorCode, message: String },

    /// The key-value store a PJRT client shares with its peers failed
    /// (DEADLINE_EXCEEDED: a key no peer put in time; NOT_FOUND: not there now).
    #[error("key-value store: {message}")]
    KeyValueStore { code: ErrorCode, message: String },

    /// `rtpu.set_recompile_limit(n)` was passed at a site.
    #[error(
        "{site} would compile its graph number {count}, past the recompile limit of {limit}: \
         {explanation}"
    )]
    RecompileLimit {
        site: String,
        count: u64,
        limit: u64,
        explanation: String,
    },
}

impl Error {
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Pjrt { code, .. } => *code,
            Error::NoPlugin { .. } | Error::PluginLoad { .. } => ErrorCode::NotFound,
            Error::ApiVersionMismatch { .. } => ErrorCode::FailedPrecondition,
            Error::MissingFunction { .. } => ErrorCode::Unimplemented,
            Error::InvalidArgument { .. } | Error::UnknownDType { .. } => {
                ErrorCode::InvalidArgument
            }
            Error::UnsupportedBufferType { .. } | Error::NotLowered { .. } => {
                ErrorCode::Unimplemented
            }
            Error::DeferredGraph { code, .. }
            | Error::LostValue { code, .. }
            | Error::Collective { code, .. }
            | Error::KeyValueStore { code, .. } => *code,
            Error::RecompileLimit { .. } => ErrorCode::FailedPrecondition,
            Error::OutOfMemory { .. } => ErrorCode::ResourceExhausted,
        }
    }

    /// Shorthand for the common "expected X, got Y" rejection of caller input.
    pub fn invalid(
        what: impl Into<String>,
        expected: impl fmt::Display,
        got: impl fmt::Display,
    ) -> Error {
        Error::InvalidArgument {
            what: what.into(),
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }
}
