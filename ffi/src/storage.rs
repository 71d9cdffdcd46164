//! `rtpu_storage` and `rtpu_tensor_ref`: PyTorch's storages and strided
//! views of them, for the PrivateUse1 shim.

use std::sync::Arc;

use rtpu_core::storage::{Storage, View};

use crate::boundary::{
    fallible, infallible, non_null, release_arc, retain_arc, slice, slice_mut, Out,
};
use crate::buffer::dtype_from_c;
use crate::error::{rtpu_error, FfiError};
use crate::runtime::{rtpu_runtime, runtime_ref};

/// A device storage of a number of bytes (PyTorch's untyped storage).
/// Reference counted: `rtpu_storage_new` and every call that returns one
/// give one reference; drop it with `rtpu_storage_release`. Thread-safe.
pub struct rtpu_storage {
    _private: [u8; 0],
}

/// A strided view of a storage, as ATen describes a tensor. Borrowed: rtpu
/// reads it only during the call it is passed to.
#[repr(C)]
pub struct rtpu_tensor_ref {
    /// The storage viewed. Required.
    pub storage: *const rtpu_storage,
    /// In elements of `dtype`, >= 0.
    pub storage_offset: i64,
    /// `ndim` sizes (>= 0); may be NULL when `ndim` is 0.
    pub sizes: *const i64,
    /// `ndim` strides in elements (>= 0); may be NULL when `ndim` is 0.
    pub strides: *const i64,
    pub ndim: usize,
    /// One of `RTPU_DTYPE_*`.
    pub dtype: u32,
}

pub(crate) fn storage_into_raw(storage: Arc<Storage>) -> *mut rtpu_storage {
    Arc::into_raw(storage).cast_mut().cast()
}

/// # Safety
/// A non-NULL `storage` must be a live handle from rtpu.
pub(crate) unsafe fn storage_ref<'a>(
    storage: *const rtpu_storage,
    what: &str,
) -> Result<&'a Storage, FfiError> {
    // SAFETY: guaranteed by the caller.
    unsafe { non_null(storage.cast::<Storage>(), what) }
}

/// A new shared reference to the storage behind a live handle.
///
/// # Safety
/// `storage` must be a live, non-NULL handle from rtpu.
pub(crate) unsafe fn storage_arc(storage: *const rtpu_storage) -> Arc<Storage> {
    let ptr = storage.cast::<Storage>();
    // SAFETY: the handle holds a reference, so the count is at least one; we
    // take one more for the returned Arc.
    unsafe {
        Arc::increment_strong_count(ptr);
        Arc::from_raw(ptr)
    }
}

/// The storage and view a C tensor ref describes.
///
/// # Safety
/// `tensor`'s pointers must be valid as its documentation says.
/// `what` names the ref in errors; it is called only when there is one.
pub(crate) unsafe fn tensor_view(
    tensor: &rtpu_tensor_ref,
    what: impl Fn() -> String,
) -> Result<(Arc<Storage>, View), FfiError> {
    let named = |e: FfiError| e.within(&what());
    // SAFETY: guaranteed by the caller.
    unsafe { storage_ref(tensor.storage, "storage") }.map_err(named)?;
    // SAFETY: guaranteed by the caller.
    let sizes = unsafe { slice(tensor.sizes, tensor.ndim, "sizes") }.map_err(named)?;
    // SAFETY: guaranteed by the caller.
    let strides = unsafe { slice(tensor.strides, tensor.ndim, "strides") }.map_err(named)?;
    let view = View {
        offset: tensor.storage_offset,
        sizes: sizes.into(),
        strides: strides.into(),
        dtype: dtype_from_c(tensor.dtype)?,
    };
    // SAFETY: checked non-NULL and live above.
    Ok((unsafe { storage_arc(tensor.storage) }, view))
}

/// The storage and view of the tensor ref at `tensor`, named `what` in
/// errors.
///
/// # Safety
/// A non-NULL `tensor` must point to a ref whose pointers are valid as its
/// documentation says.
unsafe fn tensor_view_at(
    tensor: *const rtpu_tensor_ref,
    what: &str,
) -> Result<(Arc<Storage>, View), FfiError> {
    // SAFETY: guaranteed by the caller.
    let tensor = unsafe { non_null(tensor, what) }?;
    // SAFETY: guaranteed by the caller.
    unsafe { tensor_view(tensor, || what.to_string()) }
}

/// Creates a storage of `nbytes` on device `device_index` of the runtime. It
/// reads as zeros until written. On success the caller owns one reference.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_new(
    runtime: *const rtpu_runtime,
    device_index: usize,
    nbytes: usize,
    storage_out: *mut *mut rtpu_storage,
) -> *mut rtpu_error {
    fallible("rtpu_storage_new", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let rt = unsafe { runtime_ref(runtime) }?;
        let storage_out = Out::new(storage_out, "storage_out")?;
        let storage = Storage::new(&rt.client, device_index, nbytes)?;
        storage_out.write(storage_into_raw(storage));
        Ok(())
    })
}

/// Adds a reference. NULL is a no-op. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_retain(storage: *const rtpu_storage) {
    // SAFETY: a non-NULL handle is live, so it holds at least one reference.
    infallible((), || unsafe { retain_arc(storage.cast::<Storage>()) })
}

/// Drops a reference; the last frees the storage's device memory. NULL is a
/// no-op. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_release(storage: *const rtpu_storage) {
    // SAFETY: the caller gives up one reference it holds.
    infallible((), || unsafe { release_arc(storage.cast::<Storage>()) })
}

/// The storage's size in bytes. NULL gives 0. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_nbytes(storage: *const rtpu_storage) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { storage_ref(storage, "storage") }.map_or(0, |s| s.nbytes())
    })
}

/// The index of the storage's device in its runtime. NULL gives 0.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_device_index(storage: *const rtpu_storage) -> usize {
    infallible(0, || {
        // SAFETY: a non-NULL handle is live per the docs.
        unsafe { storage_ref(storage, "storage") }.map_or(0, |s| s.device_index())
    })
}

/// Resizes the storage to `nbytes`, keeping the common prefix; new bytes
/// read as zeros (PyTorch's `resize_`). Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_resize(
    storage: *const rtpu_storage,
    nbytes: usize,
) -> *mut rtpu_error {
    fallible("rtpu_storage_resize", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let storage = unsafe { storage_ref(storage, "storage") }?;
        storage.resize(nbytes)?;
        Ok(())
    })
}

/// Writes `nbytes` of dense row-major host data into the view `dst`; the rest
/// of the storage is unchanged. `nbytes` must be the view's element count
/// times its dtype's size. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_tensor_copy_from_host(
    dst: *const rtpu_tensor_ref,
    data: *const std::ffi::c_void,
    nbytes: usize,
) -> *mut rtpu_error {
    fallible("rtpu_tensor_copy_from_host", || {
        // SAFETY: a non-NULL `dst` points to a valid tensor ref per the docs.
        let (storage, view) = unsafe { tensor_view_at(dst, "dst") }?;
        // SAFETY: documented as `nbytes` readable bytes.
        let bytes = unsafe { slice(data.cast::<u8>(), nbytes, "data") }?;
        storage.write_view(&view, bytes)?;
        Ok(())
    })
}

/// Copies the view `src` to `data` as dense row-major elements; `nbytes`
/// must be the view's element count times its dtype's size. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_tensor_copy_to_host(
    src: *const rtpu_tensor_ref,
    data: *mut std::ffi::c_void,
    nbytes: usize,
) -> *mut rtpu_error {
    fallible("rtpu_tensor_copy_to_host", || {
        // SAFETY: a non-NULL `src` points to a valid tensor ref per the docs.
        let (storage, view) = unsafe { tensor_view_at(src, "src") }?;
        view.check_within(storage.elements(view.dtype)?)?;
        let expected = view.numel() * view.dtype.size_in_bytes();
        if nbytes != expected {
            return Err(FfiError::invalid(format!(
                "nbytes is {nbytes}; the view holds {expected}"
            )));
        }
        if expected == 0 {
            return Ok(());
        }
        // SAFETY: the caller provides `nbytes` writable bytes at `data`, not
        // aliased during the call.
        let dst = unsafe { slice_mut(data.cast::<u8>(), expected, "data") }?;
        Ok(storage.read_view_into(&view, dst)?)
    })
}
