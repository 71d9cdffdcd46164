//! The key-value store a PJRT client may use to find its peers.
//!
//! Plugins that run XLA collectives across processes (libtpu, XLA's CUDA
//! plugin) exchange their topology through a store shared by the processes
//! of a job when the client is created, given with the `node_id` and
//! `num_nodes` create options, as JAX passes its distributed client's store.
//! The CPU plugins ignore it. rtpu adapts an embedder's store to PJRT's
//! callbacks here; the store must outlive the client, which holds it.

use std::alloc::{self, Layout};
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorCode};
use crate::runtime::sys;

/// A store shared by the processes of a job (torch.distributed's TCPStore,
/// an etcd, ...). Every method may be called from any thread.
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to
    /// put it (DEADLINE_EXCEEDED when none does).
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, Error>;
    /// The value of `key` if it is there now, `None` if not.
    fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error>;
}

/// The store as PJRT's callbacks see it: the `user_arg` of all three.
pub(crate) struct StoreCallbacks {
    store: Arc<dyn KeyValueStore>,
}

impl StoreCallbacks {
    pub(crate) fn new(store: Arc<dyn KeyValueStore>) -> Box<StoreCallbacks> {
        Box::new(StoreCallbacks { store })
    }

    /// Points `args`' callbacks at `self`, which must outlive the client.
    pub(crate) fn install(&self, args: &mut sys::PJRT_Client_Create_Args) {
        let user_arg = std::ptr::from_ref(self).cast_mut().cast();
        args.kv_get_callback = Some(get_callback);
        args.kv_get_user_arg = user_arg;
        args.kv_try_get_callback = Some(try_get_callback);
        args.kv_try_get_user_arg = user_arg;
        args.kv_put_callback = Some(put_callback);
        args.kv_put_user_arg = user_arg;
    }
}

/// A length-prefixed copy of `bytes` that `free_value` releases: PJRT's
/// value deleter receives only the pointer.
fn value_for_plugin(bytes: &[u8]) -> *mut c_char {
    const HEADER: usize = size_of::<usize>();
    let Ok(layout) = Layout::from_size_align(HEADER + bytes.len(), align_of::<usize>()) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `layout` has a nonzero size (HEADER > 0).
    let start = unsafe { alloc::alloc(layout) };
    if start.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `start` holds HEADER + len bytes, aligned for usize.
    unsafe {
        start.cast::<usize>().write(bytes.len());
        let value = start.add(HEADER);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), value, bytes.len());
        value.cast()
    }
}

/// PJRT's value deleter for what `value_for_plugin` made.
unsafe extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    const HEADER: usize = size_of::<usize>();
    // SAFETY: `value` came from `value_for_plugin`, HEADER bytes after the
    // start of an allocation whose first word is the value's length.
    unsafe {
        let start = value.cast::<u8>().sub(HEADER);
        let len = start.cast::<usize>().read();
        let layout = Layout::from_size_align_unchecked(HEADER + len, align_of::<usize>());
        alloc::dealloc(start, layout);
    }
}

/// Runs one callback's body, turning an error (or a panic, which must not
/// cross into the plugin) into a PJRT error made by the plugin's
/// `callback_error`.
fn answer(
    callback_error: *mut sys::PJRT_CallbackError,
    body: impl FnOnce() -> Result<(), Error>,
) -> *mut sys::PJRT_Error {
    let error = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(_) => Error::KeyValueStore {
            code: ErrorCode::Internal,
            message: "the store panicked".into(),
        },
    };
    // SAFETY: PJRT passes a valid pointer to its error constructor.
    let Some(make) = (unsafe { callback_error.as_ref() }).copied().flatten() else {
        return std::ptr::null_mut();
    };
    let message = error.to_string();
    // SAFETY: `make` copies the message during the call.
    unsafe { make(error.code() as u32, message.as_ptr().cast(), message.len()) }
}

/// # Safety
/// `user_arg` is a `StoreCallbacks` installed by `install`; `key` points to
/// `key_size` bytes.
unsafe fn parts<'a>(
    user_arg: *mut std::ffi::c_void,
    key: *const c_char,
    key_size: usize,
) -> (&'a StoreCallbacks, &'a [u8]) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        let key = if key_size == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(key.cast(), key_size)
        };
        (&*user_arg.cast::<StoreCallbacks>(), key)
    }
}

unsafe extern "C" fn get_callback(
    args: *mut sys::PJRT_KeyValueGetCallback_Args,
) -> *mut sys::PJRT_Error {
    // SAFETY: PJRT passes valid args for the call.
    let args = unsafe { &mut *args };
    answer(args.callback_error, || {
        // SAFETY: the user_arg is ours; the key is the plugin's, valid now.
        let (callbacks, key) = unsafe { parts(args.user_arg, args.key, args.key_size) };
        let timeout = Duration::from_millis(u64::try_from(args.timeout_in_ms).unwrap_or(0));
        let value = callbacks.store.get(key, timeout)?;
        args.value = value_for_plugin(&value);
        args.value_size = value.len();
        args.value_deleter_callback = Some(free_value);
        Ok(())
    })
}

unsafe extern "C" fn try_get_callback(
    args: *mut sys::PJRT_KeyValueTryGetCallback_Args,
) -> *mut sys::PJRT_Error {
    // SAFETY: PJRT passes valid args for the call.
    let args = unsafe { &mut *args };
    answer(args.callback_error, || {
        // SAFETY: the user_arg is ours; the key is the plugin's, valid now.
        let (callbacks, key) = unsafe { parts(args.user_arg, args.key, args.key_size) };
        let value = callbacks
            .store
            .try_get(key)?
            .ok_or_else(|| Error::KeyValueStore {
                code: ErrorCode::NotFound,
                message: format!("no key {:?} yet", String::from_utf8_lossy(key)),
            })?;
        args.value = value_for_plugin(&value);
        args.value_size = value.len();
        args.value_deleter_callback = Some(free_value);
        Ok(())
    })
}

unsafe extern "C" fn put_callback(
    args: *mut sys::PJRT_KeyValuePutCallback_Args,
) -> *mut sys::PJRT_Error {
    // SAFETY: PJRT passes valid args for the call.
    let args = unsafe { &mut *args };
    answer(args.callback_error, || {
        // SAFETY: the user_arg is ours; key and value are the plugin's, valid now.
        let (callbacks, key) = unsafe { parts(args.user_arg, args.key, args.key_size) };
        let value = if args.value_size == 0 {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(args.value.cast(), args.value_size) }
        };
        callbacks.store.put(key, value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::{Condvar, Mutex};
    use std::time::Instant;

    /// A store in this process's memory, as a single-process job would use.
    #[derive(Default)]
    struct MemoryStore {
        values: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
        changed: Condvar,
    }

    impl KeyValueStore for MemoryStore {
        fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
            let deadline = Instant::now() + timeout;
            let mut values = self.values.lock().unwrap();
            loop {
                if let Some(value) = values.get(key) {
                    return Ok(value.clone());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::KeyValueStore {
                        code: ErrorCode::DeadlineExceeded,
                        message: "no value in time".into(),
                    });
                }
                values = self.changed.wait_timeout(values, left).unwrap().0;
            }
        }
        fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
            Ok(self.values.lock().unwrap().get(key).cloned())
        }
        fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
            if key == b"panic" {
                panic!("a store bug");
            }
            self.values
                .lock()
                .unwrap()
                .insert(key.to_vec(), value.to_vec());
            self.changed.notify_all();
            Ok(())
        }
    }

    thread_local! {
        /// What the last `record_error` call was given.
        static LAST_ERROR: std::cell::RefCell<Option<(u32, String)>> = const { std::cell::RefCell::new(None) };
    }

    /// Stands in for the plugin's error constructor: records the code and
    /// message and returns a non-NULL marker.
    unsafe extern "C" fn record_error(
        code: u32,
        message: *const c_char,
        size: usize,
    ) -> *mut sys::PJRT_Error {
        // SAFETY: `answer` passes its message's bytes.
        let text = unsafe { std::slice::from_raw_parts(message.cast::<u8>(), size) };
        LAST_ERROR.with(|e| *e.borrow_mut() = Some((code, String::from_utf8_lossy(text).into())));
        std::ptr::NonNull::dangling().as_ptr()
    }

    fn installed(store: Arc<MemoryStore>) -> (Box<StoreCallbacks>, sys::PJRT_Client_Create_Args) {
        let callbacks = StoreCallbacks::new(store);
        let mut create = sys::PJRT_Client_Create_Args::default();
        callbacks.install(&mut create);
        (callbacks, create)
    }

    fn put(create: &sys::PJRT_Client_Create_Args, key: &str, value: &[u8]) -> *mut sys::PJRT_Error {
        let mut make_error: sys::PJRT_CallbackError = Some(record_error);
        let mut args = sys::PJRT_KeyValuePutCallback_Args {
            struct_size: size_of::<sys::PJRT_KeyValuePutCallback_Args>(),
            extension_start: std::ptr::null_mut(),
            key: key.as_ptr().cast(),
            key_size: key.len(),
            value: value.as_ptr().cast(),
            value_size: value.len(),
            callback_error: &mut make_error,
            user_arg: create.kv_put_user_arg,
        };
        // SAFETY: valid args, as a plugin passes them.
        unsafe { create.kv_put_callback.unwrap()(&mut args) }
    }

    /// What the get callback answers for `key`: the value, or the error's code.
    fn get(
        create: &sys::PJRT_Client_Create_Args,
        key: &str,
        timeout_ms: i32,
    ) -> Result<Vec<u8>, u32> {
        let mut make_error: sys::PJRT_CallbackError = Some(record_error);
        let mut args = sys::PJRT_KeyValueGetCallback_Args {
            struct_size: size_of::<sys::PJRT_KeyValueGetCallback_Args>(),
            extension_start: std::ptr::null_mut(),
            key: key.as_ptr().cast(),
            key_size: key.len(),
            timeout_in_ms: timeout_ms,
            callback_error: &mut make_error,
            user_arg: create.kv_get_user_arg,
            value: std::ptr::null_mut(),
            value_size: 0,
            value_deleter_callback: None,
        };
        // SAFETY: valid args, as a plugin passes them.
        if !unsafe { create.kv_get_callback.unwrap()(&mut args) }.is_null() {
            return Err(LAST_ERROR.with(|e| e.borrow().clone()).unwrap().0);
        }
        // SAFETY: the callback returned `value_size` bytes at `value`.
        let value = unsafe { std::slice::from_raw_parts(args.value.cast::<u8>(), args.value_size) }
            .to_vec();
        // SAFETY: the plugin frees the value once, with the deleter given.
        unsafe { args.value_deleter_callback.unwrap()(args.value) };
        Ok(value)
    }

    fn try_get(create: &sys::PJRT_Client_Create_Args, key: &str) -> Result<Vec<u8>, u32> {
        let mut make_error: sys::PJRT_CallbackError = Some(record_error);
        let mut args = sys::PJRT_KeyValueTryGetCallback_Args {
            struct_size: size_of::<sys::PJRT_KeyValueTryGetCallback_Args>(),
            extension_start: std::ptr::null_mut(),
            key: key.as_ptr().cast(),
            key_size: key.len(),
            callback_error: &mut make_error,
            user_arg: create.kv_try_get_user_arg,
            value: std::ptr::null_mut(),
            value_size: 0,
            value_deleter_callback: None,
        };
        // SAFETY: valid args, as a plugin passes them.
        if !unsafe { create.kv_try_get_callback.unwrap()(&mut args) }.is_null() {
            return Err(LAST_ERROR.with(|e| e.borrow().clone()).unwrap().0);
        }
        // SAFETY: as in `get`.
        let value = unsafe { std::slice::from_raw_parts(args.value.cast::<u8>(), args.value_size) }
            .to_vec();
        // SAFETY: as in `get`.
        unsafe { args.value_deleter_callback.unwrap()(args.value) };
        Ok(value)
    }

    #[test]
    fn plugin_callbacks_reach_the_store_and_its_errors_come_back_as_pjrt_codes() {
        let (_callbacks, create) = installed(Arc::default());
        assert!(put(&create, "topology/0", b"\x00node zero\xff").is_null());
        assert_eq!(
            get(&create, "topology/0", 1000).unwrap(),
            b"\x00node zero\xff"
        );
        assert!(put(&create, "empty", b"").is_null());
        assert_eq!(try_get(&create, "empty").unwrap(), b"");
        assert_eq!(
            try_get(&create, "topology/1"),
            Err(ErrorCode::NotFound as u32)
        );
        assert_eq!(
            get(&create, "topology/1", 20),
            Err(ErrorCode::DeadlineExceeded as u32)
        );
        // A panic inside the store stops at the callback, as an INTERNAL error.
        assert!(!put(&create, "panic", b"").is_null());
        let (code, message) = LAST_ERROR.with(|e| e.borrow().clone()).unwrap();
        assert_eq!(
            (code, message.as_str()),
            (
                ErrorCode::Internal as u32,
                "key-value store: the store panicked"
            )
        );
    }

    #[test]
    fn a_get_waits_for_the_put_of_another_thread() {
        let store = Arc::new(MemoryStore::default());
        let (_callbacks, create) = installed(store.clone());
        let putter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            store.put(b"late", b"here").unwrap();
        });
        assert_eq!(get(&create, "late", 10_000).unwrap(), b"here");
        putter.join().unwrap();
    }
}
