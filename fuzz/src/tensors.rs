//! Storages and strided views made through the C ABI, and reading them
//! back, with the arrays the views point into kept alive for a call.

use std::ffi::CString;

use rtpu::ops::rtpu_op_arg;
use rtpu::storage::{
    rtpu_storage, rtpu_storage_nbytes, rtpu_storage_new, rtpu_storage_release,
    rtpu_tensor_copy_from_host, rtpu_tensor_copy_to_host, rtpu_tensor_ref,
};

use crate::{runtime, take, Outcome};

/// Reads of more than this many bytes are skipped (an op may legitimately
/// describe a huge expanded view).
pub const MAX_READ_BYTES: u128 = 1 << 24;

/// The bytes of one element of an `RTPU_DTYPE_*`, or `None` for a code
/// that is not one.
pub fn dtype_size(dtype: u32) -> Option<usize> {
    Some(match dtype {
        1 | 2 | 6 => 1,
        3 | 7 | 10 | 11 => 2,
        4 | 8 | 12 => 4,
        5 | 9 | 13 | 14 => 8,
        15 => 16,
        _ => return None,
    })
}

/// What one call's arguments borrow: storages (one reference each, released
/// on drop) and the arrays tensor refs and list arguments point into. Each
/// array is boxed, so its address stays put as more are added.
#[derive(Default)]
pub struct Arena {
    storages: Vec<*mut rtpu_storage>,
    ints: Vec<Box<[i64]>>,
    floats: Vec<Box<[f64]>>,
    refs: Vec<Box<[rtpu_tensor_ref]>>,
    strings: Vec<CString>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        for &storage in &self.storages {
            rtpu_storage_release(storage);
        }
    }
}

impl Arena {
    pub fn ints(&mut self, values: Vec<i64>) -> *const i64 {
        self.ints.push(values.into_boxed_slice());
        self.ints.last().map_or(std::ptr::null(), |b| b.as_ptr())
    }

    pub fn floats(&mut self, values: Vec<f64>) -> *const f64 {
        self.floats.push(values.into_boxed_slice());
        self.floats.last().map_or(std::ptr::null(), |b| b.as_ptr())
    }

    pub fn refs(&mut self, values: Vec<rtpu_tensor_ref>) -> *const rtpu_tensor_ref {
        self.refs.push(values.into_boxed_slice());
        self.refs.last().map_or(std::ptr::null(), |b| b.as_ptr())
    }

    pub fn string(&mut self, text: &str) -> *const std::ffi::c_char {
        let text = CString::new(text.replace('\0', "")).unwrap_or_default();
        self.strings.push(text);
        self.strings.last().map_or(std::ptr::null(), |s| s.as_ptr())
    }

    /// A new storage of `nbytes` holding `bytes` (elements of `dtype`) at
    /// its start, kept until the arena drops; `None` when rtpu refuses it.
    /// (A storage holds values of the dtype last written, as on a device.)
    /// When rtpu refuses the write (a size that is no multiple of the
    /// dtype's), the storage stays unwritten: the op call must then refuse
    /// it too.
    pub fn storage(
        &mut self,
        nbytes: usize,
        bytes: &[u8],
        dtype: u32,
    ) -> Option<*mut rtpu_storage> {
        let mut storage = std::ptr::null_mut();
        if !take(rtpu_storage_new(runtime(), 0, nbytes, &mut storage)).is_ok() {
            return None;
        }
        self.storages.push(storage);
        if let (false, Some(size)) = (bytes.is_empty(), dtype_size(dtype)) {
            let count = [(bytes.len() / size) as i64];
            let whole = self.view(storage, 0, &count, &[1], dtype);
            take(rtpu_tensor_copy_from_host(
                &whole,
                bytes.as_ptr().cast(),
                bytes.len(),
            ));
        }
        Some(storage)
    }

    /// A view of `storage`; the arrays live as long as the arena.
    pub fn view(
        &mut self,
        storage: *const rtpu_storage,
        offset: i64,
        sizes: &[i64],
        strides: &[i64],
        dtype: u32,
    ) -> rtpu_tensor_ref {
        rtpu_tensor_ref {
            storage,
            storage_offset: offset,
            sizes: self.ints(sizes.to_vec()),
            strides: self.ints(strides.to_vec()),
            ndim: sizes.len(),
            dtype,
        }
    }
}

/// The number of bytes a view covers densely, or `None` when it is not a
/// readable view (bad dtype, negative or overflowing sizes).
pub fn view_bytes(view: &rtpu_tensor_ref) -> Option<u128> {
    let size = dtype_size(view.dtype)? as u128;
    let sizes = if view.ndim == 0 {
        &[][..]
    } else {
        // SAFETY: `sizes` holds `ndim` elements (ours, or an output's,
        // which lives until its result is destroyed).
        unsafe { std::slice::from_raw_parts(view.sizes, view.ndim) }
    };
    sizes.iter().try_fold(size, |acc, &s| {
        u128::try_from(s).ok().and_then(|s| acc.checked_mul(s))
    })
}

/// Reads a view back to the host (skipped past `MAX_READ_BYTES`).
pub fn read(view: &rtpu_tensor_ref) -> Option<(Outcome, Vec<u8>)> {
    let nbytes = view_bytes(view).filter(|&n| n <= MAX_READ_BYTES)? as usize;
    let mut data = vec![0u8; nbytes];
    let outcome = take(rtpu_tensor_copy_to_host(
        view,
        data.as_mut_ptr().cast(),
        nbytes,
    ));
    Some((outcome, data))
}

/// All whole elements of `dtype` in a storage (for checking a refused call
/// changed nothing).
pub fn storage_bytes(
    arena: &mut Arena,
    storage: *const rtpu_storage,
    dtype: u32,
) -> Option<Vec<u8>> {
    let nbytes = rtpu_storage_nbytes(storage);
    if nbytes as u128 > MAX_READ_BYTES {
        return None;
    }
    let count = nbytes / dtype_size(dtype)?;
    let whole = arena.view(storage, 0, &[count as i64], &[1], dtype);
    match read(&whole)? {
        (Outcome::Ok, bytes) => Some(bytes),
        _ => None,
    }
}

/// A copy of a tensor ref (the ABI struct is not `Copy`); it borrows the
/// same arrays.
pub fn copy_ref(t: &rtpu_tensor_ref) -> rtpu_tensor_ref {
    rtpu_tensor_ref {
        storage: t.storage,
        storage_offset: t.storage_offset,
        sizes: t.sizes,
        strides: t.strides,
        ndim: t.ndim,
        dtype: t.dtype,
    }
}

/// An argument with nothing set but its tag.
pub fn arg(tag: u32) -> rtpu_op_arg {
    rtpu_op_arg {
        tag,
        tensor: rtpu_tensor_ref {
            storage: std::ptr::null(),
            storage_offset: 0,
            sizes: std::ptr::null(),
            strides: std::ptr::null(),
            ndim: 0,
            dtype: 0,
        },
        int_value: 0,
        double_value: 0.0,
        bool_value: false,
        int_list: std::ptr::null(),
        double_list: std::ptr::null(),
        tensor_list: std::ptr::null(),
        list_size: 0,
        string_value: std::ptr::null(),
    }
}
