//! The disk cache of compiled executables: what it holds, and emptying it.

use rtpu_core::engine::disk_cache;

use crate::boundary::{check_struct_size, fallible, out_ptr, Out};
use crate::error::rtpu_error;
use crate::executable::rtpu_bytes;

/// What the disk cache holds, filled by `rtpu_cache_get_info`.
#[repr(C)]
pub struct rtpu_cache_info {
    /// In: set to `RTPU_CACHE_INFO_STRUCT_SIZE` by the caller.
    pub struct_size: usize,
    /// Whether executables are kept on disk: `RTPU_CACHE_DIR` is not empty
    /// and its directory is this user's own.
    pub enabled: bool,
    /// Entries (one compiled program each) and their bytes.
    pub entries: u64,
    pub bytes: u64,
    /// The size cap (`RTPU_CACHE_MAX_BYTES`, default 1 GiB); the entries
    /// used least recently are removed past it.
    pub max_bytes: u64,
}

/// `sizeof(rtpu_cache_info)`.
pub const RTPU_CACHE_INFO_STRUCT_SIZE: usize = 40;

/// Fills `*info_out` up to its `struct_size` (which the caller sets), only
/// on success. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_cache_get_info(info_out: *mut rtpu_cache_info) -> *mut rtpu_error {
    fallible("rtpu_cache_get_info", || {
        let info_out = out_ptr(info_out, "info_out")?;
        // SAFETY: non-NULL; its first field is `struct_size`.
        let given = unsafe { (*info_out).struct_size };
        check_struct_size("rtpu_cache_info", given, RTPU_CACHE_INFO_STRUCT_SIZE)?;
        let info = disk_cache::info();
        // SAFETY: the caller's struct is at least the size checked above.
        unsafe {
            info_out.write(rtpu_cache_info {
                struct_size: given,
                enabled: info.dir.is_some(),
                entries: info.entries,
                bytes: info.bytes,
                max_bytes: info.max_bytes,
            })
        };
        Ok(())
    })
}

/// Writes to `*dir_out` the cache directory's path (no NUL), or an empty
/// string when the cache is off; the caller owns it (`rtpu_bytes_destroy`).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_cache_dir(dir_out: *mut *mut rtpu_bytes) -> *mut rtpu_error {
    fallible("rtpu_cache_dir", || {
        let dir_out = Out::new(dir_out, "dir_out")?;
        let path = disk_cache::info()
            .dir
            .map(|d| d.into_os_string().into_encoded_bytes())
            .unwrap_or_default();
        dir_out.write(Box::into_raw(Box::new(path)).cast());
        Ok(())
    })
}

/// Removes every entry of the disk cache, writing how many to
/// `*removed_out`. Executables already loaded stay usable. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_cache_clear(removed_out: *mut u64) -> *mut rtpu_error {
    fallible("rtpu_cache_clear", || {
        let removed_out = Out::new(removed_out, "removed_out")?;
        removed_out.write(disk_cache::clear());
        Ok(())
    })
}
