//! `rtpu_key_value_store`: an embedder's store, shared by the processes of a
//! job, that a PJRT client uses to find its peers (see `rtpu_runtime_open`).

use std::ffi::{c_char, c_void};
use std::time::Duration;

use rtpu_core::runtime::KeyValueStore;
use rtpu_core::{Error, ErrorCode};

use crate::boundary::call_with_error_buffer;

/// What `rtpu_key_value_store.get` returns when the key is not there (not
/// yet, or not within the timeout).
pub const RTPU_KEY_VALUE_NOT_FOUND: i32 = 1;

/// A key-value store shared by the processes of a job (torch.distributed's
/// TCPStore, etcd, ...), through which plugins that run collectives across
/// processes (libtpu, XLA's CUDA plugin) exchange their topology when the
/// client is created. Keys and values are byte strings. Every function may
/// be called from any thread, also concurrently, for as long as the runtime
/// lives. Each returns 0 on success; on failure nonzero, with a
/// NUL-terminated message of at most `error_size` bytes in `error`.
#[repr(C)]
pub struct rtpu_key_value_store {
    /// Set to `RTPU_KEY_VALUE_STORE_STRUCT_SIZE`.
    pub struct_size: usize,
    /// Passed to every function; must stay valid until `release`.
    pub context: *mut c_void,
    /// Stores `value_size` bytes at `value` under the `key_size` bytes at `key`.
    pub put: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            key: *const c_char,
            key_size: usize,
            value: *const c_void,
            value_size: usize,
            error: *mut c_char,
            error_size: usize,
        ) -> i32,
    >,
    /// The value of `key`, waiting up to `timeout_ms` for a peer to put it
    /// (0: do not wait). On success writes a buffer the store allocated to
    /// `*value_out` and its size to `*value_size_out`; rtpu copies it and
    /// hands it back to `free_value`. Returns `RTPU_KEY_VALUE_NOT_FOUND`
    /// when the key is not there in time.
    pub get: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            key: *const c_char,
            key_size: usize,
            timeout_ms: i64,
            value_out: *mut *mut c_void,
            value_size_out: *mut usize,
            error: *mut c_char,
            error_size: usize,
        ) -> i32,
    >,
    /// Frees a buffer `get` returned.
    pub free_value: Option<unsafe extern "C" fn(context: *mut c_void, value: *mut c_void)>,
    /// Called once, when rtpu no longer needs `context`; may be NULL.
    pub release: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

pub const RTPU_KEY_VALUE_STORE_STRUCT_SIZE: usize = 48;

/// An embedder's store, called through its C functions.
pub(crate) struct CStore {
    table: rtpu_key_value_store,
}

// SAFETY: the store's documentation requires its functions to accept calls
// from any thread, concurrently.
unsafe impl Send for CStore {}
// SAFETY: as above.
unsafe impl Sync for CStore {}

impl CStore {
    /// Takes over the table (its `context` is released when the store is
    /// dropped) after checking it has the functions rtpu calls.
    pub(crate) fn new(table: &rtpu_key_value_store) -> Result<CStore, String> {
        let store = CStore {
            table: rtpu_key_value_store { ..*table },
        };
        if table.put.is_none() || table.get.is_none() || table.free_value.is_none() {
            return Err("key_value_store has a NULL put, get or free_value".into());
        }
        Ok(store)
    }

    fn failed(function: &str, (status, message): (i32, String)) -> Error {
        Error::KeyValueStore {
            code: ErrorCode::Unknown,
            message: format!("the embedder's {function} failed ({status}): {message}"),
        }
    }

    /// The value of `key`, `None` when the store says it is not there in time.
    fn read(&self, key: &[u8], timeout: Duration) -> Result<Option<Vec<u8>>, Error> {
        let get = self.table.get.expect("checked in new");
        let free_value = self.table.free_value.expect("checked in new");
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let mut value: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let mut not_found = false;
        call_with_error_buffer(|error, error_size| {
            // SAFETY: the key is readable and the outputs writable during the
            // call, as the table's contract says.
            let status = unsafe {
                get(
                    self.table.context,
                    key.as_ptr().cast(),
                    key.len(),
                    timeout_ms,
                    &mut value,
                    &mut size,
                    error,
                    error_size,
                )
            };
            not_found = status == RTPU_KEY_VALUE_NOT_FOUND;
            if not_found {
                0
            } else {
                status
            }
        })
        .map_err(|failure| CStore::failed("get", failure))?;
        if not_found {
            return Ok(None);
        }
        let bytes = if size == 0 || value.is_null() {
            Vec::new()
        } else {
            // SAFETY: on success `get` returned `size` bytes at `value`.
            unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
        };
        if !value.is_null() {
            // SAFETY: handed back once, as the contract says.
            unsafe { free_value(self.table.context, value) };
        }
        Ok(Some(bytes))
    }
}

impl KeyValueStore for CStore {
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
        self.read(key, timeout)?
            .ok_or_else(|| Error::KeyValueStore {
                code: ErrorCode::DeadlineExceeded,
                message: format!(
                    "no peer put {:?} within {} ms",
                    String::from_utf8_lossy(key),
                    timeout.as_millis()
                ),
            })
    }

    fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.read(key, Duration::ZERO)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let put = self.table.put.expect("checked in new");
        call_with_error_buffer(|error, error_size| {
            // SAFETY: key and value are readable during the call.
            unsafe {
                put(
                    self.table.context,
                    key.as_ptr().cast(),
                    key.len(),
                    value.as_ptr().cast(),
                    value.len(),
                    error,
                    error_size,
                )
            }
        })
        .map_err(|failure| CStore::failed("put", failure))
    }
}

impl Drop for CStore {
    fn drop(&mut self) {
        if let Some(release) = self.table.release {
            // SAFETY: called once, as documented; rtpu uses `context` no more.
            unsafe { release(self.table.context) };
        }
    }
}
