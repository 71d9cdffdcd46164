//! Device buffers: host transfers, device-to-device copies, metadata.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::runtime::sys::{self, Args, PJRT_Buffer};

use super::client::{Client, ClientInner, Device};
use super::event::Event;
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::metrics::{self, Metric};

/// An owned PJRT buffer on one device. Holds its client alive.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut PJRT_Buffer,
    /// The element type and dimensions, asked of PJRT on first use: they
    /// never change, and each launch checks its arguments' against the
    /// program's (two PJRT calls per argument, a few percent of an eager op).
    shape: OnceLock<(DType, Dims)>,
}

// SAFETY: PJRT buffers are thread-safe handles.
unsafe impl Send for Buffer {}
// SAFETY: as above; every method takes `&self` and PJRT synchronises internally.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Takes ownership of `raw`, a buffer of `client`.
    pub(crate) fn from_raw(client: Arc<ClientInner>, raw: *mut PJRT_Buffer) -> Buffer {
        // A leak shows as a count that grows.
        metrics::add(Metric::LiveBuffers, 1);
        Buffer {
            client,
            raw,
            shape: OnceLock::new(),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        metrics::sub(Metric::LiveBuffers, 1);
        let mut args = sys::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        // SAFETY: `raw` is owned by `self` and destroyed exactly once.
        let _ = unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_Destroy, &mut args) };
    }
}

/// PJRT's element type for `dtype`.
pub(crate) fn pjrt_type(dtype: DType) -> sys::PJRT_Buffer_Type {
    use sys::*;
    match dtype {
        DType::Bool => PJRT_Buffer_Type_PJRT_Buffer_Type_PRED,
        DType::I8 => PJRT_Buffer_Type_PJRT_Buffer_Type_S8,
        DType::I16 => PJRT_Buffer_Type_PJRT_Buffer_Type_S16,
        DType::I32 => PJRT_Buffer_Type_PJRT_Buffer_Type_S32,
        DType::I64 => PJRT_Buffer_Type_PJRT_Buffer_Type_S64,
        DType::U8 => PJRT_Buffer_Type_PJRT_Buffer_Type_U8,
        DType::U16 => PJRT_Buffer_Type_PJRT_Buffer_Type_U16,
        DType::U32 => PJRT_Buffer_Type_PJRT_Buffer_Type_U32,
        DType::U64 => PJRT_Buffer_Type_PJRT_Buffer_Type_U64,
        DType::F16 => PJRT_Buffer_Type_PJRT_Buffer_Type_F16,
        DType::BF16 => PJRT_Buffer_Type_PJRT_Buffer_Type_BF16,
        DType::F32 => PJRT_Buffer_Type_PJRT_Buffer_Type_F32,
        DType::F64 => PJRT_Buffer_Type_PJRT_Buffer_Type_F64,
        DType::C64 => PJRT_Buffer_Type_PJRT_Buffer_Type_C64,
        DType::C128 => PJRT_Buffer_Type_PJRT_Buffer_Type_C128,
    }
}

/// The dtype of PJRT element type `raw`.
pub(crate) fn dtype_of(raw: sys::PJRT_Buffer_Type) -> Result<DType> {
    DType::ALL
        .into_iter()
        .find(|&d| pjrt_type(d) == raw)
        .ok_or(Error::UnsupportedBufferType { raw })
}

/// Number of elements of `dims`, or an error for negative or overflowing dims.
pub(crate) fn element_count(dims: &[i64]) -> Result<usize> {
    dims.iter().try_fold(1usize, |n, &d| {
        let d = usize::try_from(d).map_err(|_| Error::invalid("dimension", "a size >= 0", d))?;
        n.checked_mul(d)
            .ok_or_else(|| Error::invalid("shape", "fewer than 2^64 elements", format!("{dims:?}")))
    })
}

impl Client {
    /// Copies `data` (dense, row-major, `dtype` elements of shape `dims`) to `device`.
    /// The host memory may be reused as soon as this returns.
    pub fn buffer_from_host(
        &self,
        data: &[u8],
        dtype: DType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        let expected = element_count(dims)?
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| {
                Error::invalid("shape", "a byte size below 2^64", format!("{dims:?}"))
            })?;
        if data.len() != expected {
            return Err(Error::invalid(
                format!("host data for a {dtype} tensor of shape {dims:?}"),
                format!("{expected} bytes"),
                format!("{} bytes", data.len()),
            ));
        }
        if !Arc::ptr_eq(&device.client, &self.inner) {
            return Err(Error::invalid(
                "device",
                "a device of this client",
                "a device of another client",
            ));
        }
        let mut args = sys::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.inner.raw;
        args.data = data.as_ptr().cast();
        args.type_ = pjrt_type(dtype);
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        // PJRT copies the data before the call returns, so `data` need not outlive it.
        args.host_buffer_semantics =
            sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = device.raw;
        // SAFETY: `data`, `dims` and the device are valid for the call.
        unsafe {
            pjrt_call!(
                self.inner.plugin,
                PJRT_Client_BufferFromHostBuffer,
                &mut args
            )
        }?;
        let buffer = Buffer::from_raw(self.inner.clone(), args.buffer);
        if let Some(done) = Event::from_raw(self.inner.plugin, args.done_with_host_buffer) {
            done.wait()?;
        }
        Ok(buffer)
    }
}

impl Buffer {
    pub fn dtype(&self) -> Result<DType> {
        Ok(self.shape()?.0)
    }

    pub fn dims(&self) -> Result<Vec<i64>> {
        Ok(self.shape()?.1.to_vec())
    }

    pub(crate) fn shape(&self) -> Result<&(DType, Dims)> {
        if let Some(shape) = self.shape.get() {
            return Ok(shape);
        }
        let (dtype, dims) = self.plugin_shape()?;
        Ok(self.shape.get_or_init(|| (dtype, dims.into())))
    }

    /// Records the buffer's shape where its maker knows it (the type of an
    /// executable's output), sparing `shape` the plugin's answer.
    pub(crate) fn know_shape(&self, dtype: DType, dims: &[i64]) {
        let _ = self.shape.set((dtype, Dims::from(dims)));
    }

    /// The shape as the plugin reports it.
    pub(crate) fn plugin_shape(&self) -> Result<(DType, Vec<i64>)> {
        let mut type_args = sys::PJRT_Buffer_ElementType_Args::new();
        type_args.buffer = self.raw;
        // SAFETY: live buffer.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_ElementType, &mut type_args) }?;
        let dtype = dtype_of(type_args.type_)?;
        let mut dims_args = sys::PJRT_Buffer_Dimensions_Args::new();
        dims_args.buffer = self.raw;
        // SAFETY: live buffer.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_Dimensions, &mut dims_args) }?;
        let dims = match dims_args.num_dims {
            0 => Vec::new(),
            // SAFETY: PJRT returns `num_dims` dims owned by the buffer.
            n => unsafe { std::slice::from_raw_parts(dims_args.dims, n) }.to_vec(),
        };
        Ok((dtype, dims))
    }

    /// Bytes the buffer occupies on its device (may exceed the dense host size).
    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = sys::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        args.buffer = self.raw;
        // SAFETY: live buffer.
        unsafe {
            pjrt_call!(
                self.client.plugin,
                PJRT_Buffer_OnDeviceSizeInBytes,
                &mut args
            )
        }?;
        Ok(args.on_device_size_in_bytes)
    }

    /// Bytes of the dense row-major host copy.
    pub fn host_size(&self) -> Result<usize> {
        let (dtype, dims) = self.shape()?;
        Ok(element_count(dims)? * dtype.size_in_bytes())
    }

    pub fn device(&self) -> Result<Device> {
        let mut args = sys::PJRT_Buffer_Device_Args::new();
        args.buffer = self.raw;
        // SAFETY: live buffer.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_Device, &mut args) }?;
        Ok(Device {
            client: self.client.clone(),
            raw: args.device,
        })
    }

    /// Blocks until the buffer's value is computed; returns the error of
    /// the execution or transfer that was to produce it, if any.
    pub fn wait_ready(&self) -> Result<()> {
        match self.ready_event()? {
            Some(event) => event.wait(),
            None => Ok(()),
        }
    }

    /// An event that is ready once the buffer's value is computed (None:
    /// nothing to wait for). It may outlive the buffer.
    pub(crate) fn ready_event(&self) -> Result<Option<Event>> {
        let mut args = sys::PJRT_Buffer_ReadyEvent_Args::new();
        args.buffer = self.raw;
        // SAFETY: live buffer handle; PJRT returns an owned event.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_ReadyEvent, &mut args) }?;
        Ok(Event::from_raw(self.client.plugin, args.event))
    }

    /// True once the buffer was donated to an execution or deleted.
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = sys::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.raw;
        // SAFETY: live buffer handle (deleted contents are fine to query).
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_IsDeleted, &mut args) }?;
        Ok(args.is_deleted)
    }

    /// Copies the buffer into `dst` (dense, row-major), which must be exactly
    /// `host_size()` bytes; waits for the transfer.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let expected = self.host_size()?;
        if dst.len() != expected {
            return Err(Error::invalid(
                "host destination",
                format!("{expected} bytes"),
                format!("{} bytes", dst.len()),
            ));
        }
        let mut args = sys::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        // SAFETY: `dst` is writable for `dst_size` bytes until the event completes,
        // and we wait for it before returning.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args) }?;
        match Event::from_raw(self.client.plugin, args.event) {
            Some(done) => done.wait(),
            None => Ok(()),
        }
    }

    /// Whether the buffer's bytes on the device are its elements in
    /// row-major order (no tiles, major-to-minor dimensions), so that a run
    /// of elements is a run of bytes `copy_raw_to_host` can read. True of
    /// the CPU plugin's buffers; TPUs tile theirs.
    pub fn is_dense_row_major(&self) -> Result<bool> {
        let mut args = sys::PJRT_Buffer_GetMemoryLayout_Args::new();
        args.buffer = self.raw;
        // SAFETY: live buffer; the layout it fills lives as long as the buffer.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_GetMemoryLayout, &mut args) }?;
        let layout = &args.layout;
        if layout.type_ != sys::PJRT_Buffer_MemoryLayout_Type_PJRT_Buffer_MemoryLayout_Type_Tiled {
            return Ok(false);
        }
        // SAFETY: `type_` says the union holds the tiled layout.
        let tiled = unsafe { &layout.__bindgen_anon_1.tiled };
        if tiled.num_tiles != 0 {
            return Ok(false);
        }
        let minor_to_major = match tiled.minor_to_major_size {
            0 => &[][..],
            // SAFETY: PJRT's array of `minor_to_major_size` entries, alive
            // with the buffer.
            n => unsafe { std::slice::from_raw_parts(tiled.minor_to_major, n) },
        };
        Ok(minor_to_major
            .iter()
            .rev()
            .copied()
            .eq(0..minor_to_major.len() as i64))
    }

    /// Copies `dst.len()` bytes of the buffer's device memory from byte
    /// `offset` into `dst`, with no program: the elements there when
    /// `is_dense_row_major`. Not every plugin implements it. Waits for the
    /// buffer's value first: the CPU plugin's raw copy does not, and
    /// crashed reading a buffer a running program was still to write.
    pub fn copy_raw_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.wait_ready()?;
        let mut args = sys::PJRT_Buffer_CopyRawToHost_Args::new();
        args.buffer = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.offset = offset as i64;
        args.transfer_size = dst.len() as i64;
        // SAFETY: `dst` is writable for `transfer_size` bytes until the event
        // completes, and we wait for it before returning.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_CopyRawToHost, &mut args) }?;
        match Event::from_raw(self.client.plugin, args.event) {
            Some(done) => done.wait(),
            None => Ok(()),
        }
    }

    /// Copies the buffer to a new host vector.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.host_size()?];
        self.copy_to_host(&mut bytes)?;
        Ok(bytes)
    }

    /// Copies the buffer to another device of the same client.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        if !Arc::ptr_eq(&device.client, &self.client) {
            return Err(Error::invalid(
                "device",
                "a device of the buffer's client",
                "a device of another client",
            ));
        }
        let mut args = sys::PJRT_Buffer_CopyToDevice_Args::new();
        args.buffer = self.raw;
        args.dst_device = device.raw;
        // SAFETY: live buffer and device of the same client.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_CopyToDevice, &mut args) }?;
        Ok(Buffer::from_raw(self.client.clone(), args.dst_buffer))
    }

    pub fn client(&self) -> Client {
        Client::from_inner(self.client.clone())
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.dtype(), self.dims()) {
            (Ok(dtype), Ok(dims)) => write!(f, "Buffer({dtype}{dims:?})"),
            _ => write!(f, "Buffer({:p})", self.raw),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_pjrt() {
        for dtype in DType::ALL {
            assert_eq!(dtype_of(pjrt_type(dtype)).unwrap(), dtype);
        }
    }
}
