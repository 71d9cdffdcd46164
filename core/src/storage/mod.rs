//! Device storages: PyTorch's untyped, byte-sized storage, held as one flat
//! PJRT buffer (or, sharded, as one buffer per device of a mesh: `shards`),
//! and strided views into it.
//!
//! A storage's value is typed from its first write (dtype + element count);
//! before that it reads as zeros. Views are `(offset, sizes, strides, dtype)`
//! in elements, exactly as ATen keeps them.

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;

use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client, Device};
use crate::sharding::Sharding;

mod shards;
mod view;
pub use shards::Shards;
pub use view::View;

/// What storages need from the engine, which records pending values into
/// them, captures graphs and checks indices on the device. Storage sits
/// below the engine and never calls it; the engine installs this
/// (`set_pending_work`) before it makes any pending value, capture or device
/// check, so until then there is nothing for it to do.
pub trait PendingWork: Sync {
    /// Runs the pending graph of the device, which computes the pending
    /// values of its storages.
    fn flush_device(&self, client: &Client, device_index: usize) -> Result<()>;
    /// A value is about to be read on the host (a capture in progress can
    /// then no longer be replayed).
    fn note_host_read(&self);
    /// Raises the failure of a device-side check of a graph that already
    /// ran (whose outputs a host read could otherwise see).
    fn verify_checks(&self) -> Result<()>;
    /// The elements `read` names on the host, copying only those.
    fn read_elements(&self, read: ElementRead<'_>) -> Result<Vec<u8>>;
}

/// Elements `[start, end)` of one device buffer, read as flat `dtype`
/// elements.
pub struct ElementRead<'a> {
    pub client: &'a Client,
    pub device_index: usize,
    pub buffer: &'a Arc<Buffer>,
    pub dtype: DType,
    pub elements: Range<usize>,
}

static PENDING_WORK: OnceLock<&'static dyn PendingWork> = OnceLock::new();

/// Installs the engine's side of pending values; later calls keep the first.
pub fn set_pending_work(work: &'static dyn PendingWork) {
    let _ = PENDING_WORK.set(work);
}

fn flush_device(client: &Client, device_index: usize) -> Result<()> {
    PENDING_WORK
        .get()
        .map_or(Ok(()), |work| work.flush_device(client, device_index))
}

/// A storage's value as a host read finds it.
enum HostValue {
    /// The bytes last written from the host, kept for small storages.
    Copy(Arc<Vec<u8>>),
    Buffer(Arc<Buffer>, DType),
    Sharded(Arc<Shards>, DType),
    /// Never written.
    Zeros,
}

/// What a storage holds now.
#[derive(Clone)]
pub enum StorageValue {
    /// Never written: reads as zeros of any dtype.
    Zeros,
    /// A flat (1-D) buffer of `nbytes / dtype.size_in_bytes()` elements.
    Buffer { buffer: Arc<Buffer>, dtype: DType },
    /// A value of `dtype` split over the devices of a mesh (SPMD).
    Sharded { shards: Arc<Shards>, dtype: DType },
    /// A flat value of `dtype` that the device's pending graph computes
    /// (deferred mode); reading it flushes that graph.
    Pending { dtype: DType },
    /// The deferred graph that was to compute the value failed.
    Failed { code: ErrorCode, message: String },
}

thread_local! {
    static HOST_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many times this thread has read tensor values to the host
/// (`Storage::read_view`): an op whose lowering read any is specialised on
/// those values.
pub fn host_reads() -> u64 {
    HOST_READS.with(|n| n.get())
}

/// A storage of one device (a sharded value spans a mesh that includes
/// it). Cheap to share; the value is replaced, never mutated, so readers
/// holding an old value are unaffected.
pub struct Storage {
    client: Client,
    device: Device,
    device_index: usize,
    state: Mutex<StorageState>,
}

struct StorageState {
    nbytes: usize,
    value: StorageValue,
    /// The bytes of a small value written from the host, kept while the
    /// value stands: labels and token ids uploaded each step are read back
    /// for index checks, and a device read would wait behind running work.
    host_copy: Option<Arc<Vec<u8>>>,
}

/// The bytes device `device_index` can hold: the plugin's limit when it
/// reports one, else the host's memory (a CPU device's memory is the
/// host's). Asked once per device.
pub fn device_capacity(client: &Client, device_index: usize) -> u64 {
    // Asked on every op (see `check_fits`): a fast hasher.
    static CAPACITIES: OnceLock<Mutex<FxHashMap<(usize, usize), u64>>> = OnceLock::new();
    let capacities = CAPACITIES.get_or_init(Default::default);
    let key = (client.id(), device_index);
    if let Some(&known) = capacities
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return known;
    }
    let reported = client
        .device(device_index)
        .and_then(|d| d.memory_stats())
        .ok()
        .flatten()
        .and_then(|stats| stats.bytes_limit)
        .and_then(|limit| u64::try_from(limit).ok())
        .filter(|&limit| limit > 0);
    let capacity = reported.or_else(host_memory).unwrap_or(u64::MAX);
    capacities
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, capacity);
    capacity
}

/// The host's physical memory (MemTotal of /proc/meminfo).
fn host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks that `bytes` (None: past 2^64) fit on the device, before anything
/// is allocated or lowered: a plugin asked for more aborts the process.
pub fn check_fits(
    client: &Client,
    device_index: usize,
    what: impl FnOnce() -> String,
    bytes: Option<u64>,
) -> Result<()> {
    let capacity = device_capacity(client, device_index);
    match bytes {
        Some(b) if b <= capacity => Ok(()),
        _ => Err(Error::OutOfMemory {
            what: what(),
            bytes,
            capacity,
            device: device_index,
        }),
    }
}

/// Host writes up to this size keep a host copy.
const MAX_HOST_COPY_BYTES: usize = 1 << 16;

impl Storage {
    pub fn new(client: &Client, device_index: usize, nbytes: usize) -> Result<Arc<Storage>> {
        check_fits(
            client,
            device_index,
            || "a storage".to_string(),
            Some(nbytes as u64),
        )?;
        Storage::holding(client, device_index, nbytes, StorageValue::Zeros)
    }

    /// A storage holding `buffer` (flat, `dtype`) as its value. The buffer
    /// exists, so its size needs no check.
    pub fn from_buffer(
        client: &Client,
        device_index: usize,
        buffer: Buffer,
        dtype: DType,
    ) -> Result<Arc<Storage>> {
        let nbytes = buffer.host_size()?;
        let value = StorageValue::Buffer {
            buffer: Arc::new(buffer),
            dtype,
        };
        Storage::holding(client, device_index, nbytes, value)
    }

    fn holding(
        client: &Client,
        device_index: usize,
        nbytes: usize,
        value: StorageValue,
    ) -> Result<Arc<Storage>> {
        Ok(Arc::new(Storage {
            client: client.clone(),
            device: client.device(device_index)?,
            device_index,
            state: Mutex::new(StorageState {
                nbytes,
                value,
                host_copy: None,
            }),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, StorageState> {
        // A panic while holding the lock cannot leave the state half-written
        // (every update is one assignment), so a poisoned lock is still valid.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn device_index(&self) -> usize {
        self.device_index
    }

    pub fn nbytes(&self) -> usize {
        self.state().nbytes
    }

    /// The value, with a pending one computed first (a flush of the
    /// device's pending graph): never `Pending`; `Failed` is an error.
    pub fn value(&self) -> Result<StorageValue> {
        let value = self.recorded_value();
        let value = match value {
            StorageValue::Pending { .. } => {
                flush_device(&self.client, self.device_index)?;
                self.recorded_value()
            }
            other => other,
        };
        match value {
            StorageValue::Failed { code, message } => Err(Error::LostValue { code, message }),
            StorageValue::Pending { dtype } => Err(Error::LostValue {
                code: ErrorCode::Internal,
                message: format!("its {dtype} value is in no pending graph"),
            }),
            ready => Ok(ready),
        }
    }

    /// The value as it stands, pending or not (what recording reads).
    pub fn recorded_value(&self) -> StorageValue {
        self.state().value.clone()
    }

    /// `f` of the value as recorded, without cloning it.
    pub(crate) fn with_recorded_value<R>(&self, f: impl FnOnce(&StorageValue) -> R) -> R {
        f(&self.state().value)
    }

    /// A storage of `nbytes` whose value the pending graph computes.
    pub(crate) fn pending(
        client: &Client,
        device_index: usize,
        nbytes: usize,
        dtype: DType,
    ) -> Result<Arc<Storage>> {
        let storage = Storage::new(client, device_index, nbytes)?;
        storage.set_recorded(StorageValue::Pending { dtype });
        Ok(storage)
    }

    /// Replaces the value without checks (the deferred engine's bookkeeping).
    pub(crate) fn set_recorded(&self, value: StorageValue) {
        let mut state = self.state();
        state.value = value;
        state.host_copy = None;
    }

    /// Replaces the value with a flat buffer of `dtype` covering all bytes.
    pub fn set_value(&self, buffer: Buffer, dtype: DType) -> Result<()> {
        let mut state = self.state();
        let elements = state.nbytes / dtype.size_in_bytes();
        let dims = buffer.dims()?;
        if dims != [elements as i64] || buffer.dtype()? != dtype {
            return Err(Error::invalid(
                "storage value",
                format!("{dtype}[{elements}]"),
                format!("{}{dims:?}", buffer.dtype()?),
            ));
        }
        state.host_copy = None;
        state.value = StorageValue::Buffer {
            buffer: Arc::new(buffer),
            dtype,
        };
        Ok(())
    }

    /// Elements of `dtype` the storage holds.
    pub fn elements(&self, dtype: DType) -> Result<usize> {
        let nbytes = self.nbytes();
        if nbytes % dtype.size_in_bytes() != 0 {
            return Err(Error::invalid(
                format!("storage of {nbytes} bytes viewed as {dtype}"),
                format!("a multiple of {} bytes", dtype.size_in_bytes()),
                nbytes,
            ));
        }
        Ok(nbytes / dtype.size_in_bytes())
    }

    /// All bytes of the storage on the host (zeros if never written).
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        self.host_bytes(None)
    }

    /// The storage's value for a host read: pending work ran and the device
    /// checks of the graphs before it passed.
    fn value_for_host(&self) -> Result<HostValue> {
        if let Some(work) = PENDING_WORK.get() {
            work.note_host_read();
        }
        if let Some(copy) = self.state().host_copy.clone() {
            return Ok(HostValue::Copy(copy));
        }
        let value = self.value()?;
        // Values reach the host only after the device checks of the graphs
        // before them passed.
        PENDING_WORK
            .get()
            .map_or(Ok(()), |work| work.verify_checks())?;
        let value = match value {
            StorageValue::Buffer { .. } => self.value()?,
            other => other,
        };
        Ok(match value {
            StorageValue::Buffer { buffer, dtype } => HostValue::Buffer(buffer, dtype),
            StorageValue::Sharded { shards, dtype } => HostValue::Sharded(shards, dtype),
            _ => HostValue::Zeros,
        })
    }

    /// The storage's bytes on the host: all of them, or only `elements` of
    /// `dtype` (what a view spans): read straight from device memory laid
    /// out densely, else copied from the device as a slice when that is
    /// much less than the whole.
    fn host_bytes(&self, elements: Option<(DType, Range<usize>)>) -> Result<Vec<u8>> {
        // Slicing on the device costs a small program (a compile for each
        // new range): worth it only when it saves most of a large copy.
        const MIN_SLICED_READ_BYTES: usize = 1 << 20;
        let nbytes = self.nbytes();
        let wanted = match &elements {
            Some((dtype, range)) => {
                range.start * dtype.size_in_bytes()..range.end * dtype.size_in_bytes()
            }
            None => 0..nbytes,
        };
        match self.value_for_host()? {
            HostValue::Copy(copy) => Ok(copy[wanted].to_vec()),
            HostValue::Buffer(buffer, dtype) => {
                let start = std::time::Instant::now();
                if let Some(part) = read_dense_part(&buffer, &wanted, nbytes) {
                    metrics::add(Metric::DeviceToHostBytes, wanted.len() as u64);
                    metrics::add_elapsed(Metric::WaitNs, start);
                    return Ok(part);
                }
                let bytes = match (elements, PENDING_WORK.get()) {
                    (Some((read_as, range)), Some(work))
                        if read_as == dtype
                            && nbytes >= MIN_SLICED_READ_BYTES
                            && wanted.len() * 4 <= nbytes =>
                    {
                        metrics::add(Metric::DeviceToHostBytes, wanted.len() as u64);
                        work.read_elements(ElementRead {
                            client: &self.client,
                            device_index: self.device_index,
                            buffer: &buffer,
                            dtype,
                            elements: range,
                        })
                    }
                    _ => {
                        metrics::add(Metric::DeviceToHostBytes, nbytes as u64);
                        buffer.to_host().map(|all| match wanted.len() == all.len() {
                            true => all,
                            false => all[wanted].to_vec(),
                        })
                    }
                };
                metrics::add_elapsed(Metric::WaitNs, start);
                bytes
            }
            HostValue::Sharded(shards, dtype) => {
                let start = std::time::Instant::now();
                let all = shards.to_host(dtype);
                metrics::add_elapsed(Metric::WaitNs, start);
                Ok(all?[wanted].to_vec())
            }
            HostValue::Zeros => Ok(vec![0u8; wanted.len()]),
        }
    }

    /// Replaces all bytes of the storage, typing its value as `dtype`. A
    /// sharded storage stays sharded as it was (a checkpoint loaded into a
    /// sharded model keeps its layout).
    pub fn write_host_bytes(&self, bytes: &[u8], dtype: DType) -> Result<()> {
        let elements = self.elements(dtype)?;
        if bytes.len() != self.nbytes() {
            return Err(Error::invalid("storage bytes", self.nbytes(), bytes.len()));
        }
        // A pending value would be installed over these bytes when its
        // graph runs: run it first (a failed value is simply replaced).
        if matches!(self.recorded_value(), StorageValue::Pending { .. }) {
            flush_device(&self.client, self.device_index)?;
        }
        if let StorageValue::Sharded { shards, .. } = self.recorded_value() {
            if shards.dims.iter().product::<i64>() == elements as i64 {
                let shards = Shards::upload(
                    &self.client,
                    &shards.devices,
                    &shards.dims,
                    shards.sharding.clone(),
                    bytes,
                    dtype,
                )?;
                self.set_recorded(StorageValue::Sharded {
                    shards: Arc::new(shards),
                    dtype,
                });
                return Ok(());
            }
        }
        metrics::add(Metric::HostToDeviceBytes, bytes.len() as u64);
        let buffer =
            self.client
                .buffer_from_host(bytes, dtype, &[elements as i64], &self.device)?;
        self.set_value(buffer, dtype)?;
        if bytes.len() <= MAX_HOST_COPY_BYTES {
            self.state().host_copy = Some(Arc::new(bytes.to_vec()));
        }
        Ok(())
    }

    /// The dense, row-major bytes of `view`.
    pub fn read_view(&self, view: &View) -> Result<Vec<u8>> {
        HOST_READS.with(|n| n.set(n.get() + 1));
        view.check_within(self.elements(view.dtype)?)?;
        if view.numel() == 0 {
            return Ok(Vec::new());
        }
        let span = view.span();
        let first = span.start;
        let dense = view.is_contiguous() && span.len() == view.numel();
        let spanned = self.host_bytes(Some((view.dtype, span)))?;
        if dense {
            return Ok(spanned);
        }
        let size = view.dtype.size_in_bytes();
        let mut out = Vec::with_capacity(view.numel() * size);
        for index in view.element_indices() {
            let at = (index - first) * size;
            out.extend_from_slice(&spanned[at..at + size]);
        }
        Ok(out)
    }

    /// The dense, row-major bytes of `view`, written to `dst` (exactly their
    /// size). A view of the whole storage is copied from the device straight
    /// into `dst`.
    pub fn read_view_into(&self, view: &View, dst: &mut [u8]) -> Result<()> {
        let whole = view.is_whole(self.nbytes());
        if !whole || dst.len() != self.nbytes() {
            let bytes = self.read_view(view)?;
            if bytes.len() != dst.len() {
                return Err(Error::invalid("host destination", bytes.len(), dst.len()));
            }
            dst.copy_from_slice(&bytes);
            return Ok(());
        }
        match self.value_for_host()? {
            HostValue::Copy(copy) => dst.copy_from_slice(&copy),
            HostValue::Buffer(buffer, _) => {
                metrics::add(Metric::DeviceToHostBytes, dst.len() as u64);
                let start = std::time::Instant::now();
                let copied = buffer.copy_to_host(dst);
                metrics::add_elapsed(Metric::WaitNs, start);
                copied?
            }
            HostValue::Sharded(shards, dtype) => dst.copy_from_slice(&shards.to_host(dtype)?),
            HostValue::Zeros => dst.fill(0),
        }
        Ok(())
    }

    /// Writes dense, row-major `bytes` into `view`; the rest of the storage
    /// keeps its bytes.
    pub fn write_view(&self, view: &View, bytes: &[u8]) -> Result<()> {
        view.check_within(self.elements(view.dtype)?)?;
        let size = view.dtype.size_in_bytes();
        if bytes.len() != view.numel() * size {
            return Err(Error::invalid(
                format!(
                    "host data for a {} view of sizes {:?}",
                    view.dtype, view.sizes
                ),
                format!("{} bytes", view.numel() * size),
                format!("{} bytes", bytes.len()),
            ));
        }
        let whole = view.is_whole(self.nbytes());
        if whole {
            return self.write_host_bytes(bytes, view.dtype);
        }
        let mut all = self.to_host_bytes()?;
        for (i, index) in view.element_indices().into_iter().enumerate() {
            all[index * size..(index + 1) * size].copy_from_slice(&bytes[i * size..(i + 1) * size]);
        }
        self.write_host_bytes(&all, view.dtype)
    }

    /// Grows or shrinks the storage to `nbytes`, keeping the common prefix
    /// (PyTorch's `resize_` semantics; new bytes are zeros).
    pub fn resize(&self, nbytes: usize) -> Result<()> {
        if nbytes == self.nbytes() {
            return Ok(());
        }
        check_fits(
            &self.client,
            self.device_index,
            || "a resized storage".to_string(),
            Some(nbytes as u64),
        )?;
        let old = match self.value()? {
            StorageValue::Buffer { buffer, dtype } => Some((buffer.to_host()?, dtype)),
            StorageValue::Sharded { shards, dtype } => Some((shards.to_host(dtype)?, dtype)),
            _ => None,
        };
        match old {
            Some((mut bytes, dtype)) => {
                // Resized, a sharded storage is one buffer again: its old
                // layout does not cut the new size.
                self.set_recorded(StorageValue::Zeros);
                bytes.resize(nbytes, 0);
                self.state().nbytes = nbytes;
                if nbytes % dtype.size_in_bytes() == 0 {
                    self.write_host_bytes(&bytes, dtype)
                } else {
                    self.write_host_bytes(&bytes, DType::U8)
                }
            }
            None => {
                self.state().nbytes = nbytes;
                Ok(())
            }
        }
    }

    /// Splits the storage's value, read as a `dtype` value of `dims`, over
    /// the mesh `devices` as `sharding` lays it out.
    pub fn shard(
        &self,
        dtype: DType,
        devices: &[usize],
        dims: &[i64],
        sharding: Sharding,
    ) -> Result<()> {
        let elements = self.elements(dtype)?;
        if dims.iter().product::<i64>() != elements as i64 {
            return Err(Error::invalid(
                format!("sharding a storage of {elements} {dtype} elements"),
                format!("dims of {elements} elements"),
                format!("{dims:?}"),
            ));
        }
        if let Some(&p) = sharding.partitions.iter().find(|&&p| p >= devices.len()) {
            return Err(Error::invalid(
                "a sharding's partition",
                format!("one of the mesh's {} devices", devices.len()),
                p,
            ));
        }
        let bytes = self.to_host_bytes()?;
        let shards = Shards::upload(&self.client, devices, dims, sharding, &bytes, dtype)?;
        self.set_recorded(StorageValue::Sharded {
            shards: Arc::new(shards),
            dtype,
        });
        Ok(())
    }

    /// The shards of a sharded storage (its pending value computed first);
    /// None for a storage held on one device.
    pub fn shards(&self) -> Result<Option<Arc<Shards>>> {
        Ok(match self.value()? {
            StorageValue::Sharded { shards, .. } => Some(shards),
            _ => None,
        })
    }
}

/// The bytes `wanted` of a buffer of `nbytes`, when they are a part of it
/// and its device memory holds its elements densely: read from there with
/// no program (and no copy of the rest). None where the buffer is read
/// whole, is not the storage's size, is tiled, or the plugin cannot read
/// raw memory.
fn read_dense_part(buffer: &Buffer, wanted: &Range<usize>, nbytes: usize) -> Option<Vec<u8>> {
    let a_part = wanted.len() < nbytes && buffer.host_size().ok()? == nbytes;
    if !a_part || !buffer.is_dense_row_major().ok()? {
        return None;
    }
    let mut part = vec![0u8; wanted.len()];
    buffer.copy_raw_to_host(wanted.start, &mut part).ok()?;
    Some(part)
}
