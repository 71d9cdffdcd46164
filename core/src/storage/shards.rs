//! A value held as one buffer per device of a mesh, laid out by a
//! `Sharding`: what a sharded storage holds, and what SPMD programs read
//! and write.

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client};
use crate::sharding::{tile_runs, Sharding};

/// A value of `dims` split over the devices of a mesh.
pub struct Shards {
    /// The mesh's devices (client device indices): partition `p` of a
    /// program runs on `devices[p]`.
    pub devices: Vec<usize>,
    /// The value's dims as the sharding cuts them; their product is the
    /// storage's element count (a storage is flat, so `[n]` is common).
    pub dims: Vec<i64>,
    pub sharding: Sharding,
    /// Partition `p`'s buffer: its tile, or nothing of the value when the
    /// sharding gives it none.
    pub buffers: Vec<Arc<Buffer>>,
}

impl Shards {
    /// Cuts the row-major `bytes` of a `dtype` value of `dims` into tiles
    /// and uploads each to the devices holding it.
    pub fn upload(
        client: &Client,
        devices: &[usize],
        dims: &[i64],
        sharding: Sharding,
        bytes: &[u8],
        dtype: DType,
    ) -> Result<Shards> {
        sharding.check_dims(dims)?;
        let size = dtype.size_in_bytes();
        let numel: i64 = dims.iter().product();
        if bytes.len() != numel as usize * size {
            return Err(Error::invalid(
                format!("the bytes of a {dtype}{dims:?} value"),
                numel as usize * size,
                bytes.len(),
            ));
        }
        let tile = sharding.tile_dims(dims);
        let tile_bytes = tile.iter().product::<i64>() as usize * size;
        let mut buffers = Vec::with_capacity(devices.len());
        for (partition, &device_index) in devices.iter().enumerate() {
            let mut piece = vec![0u8; tile_bytes];
            if let Some(index) = sharding.tile_of(partition) {
                let start: Vec<i64> = index.iter().zip(&tile).map(|(i, t)| i * t).collect();
                for (at, into, len) in tile_runs(dims, &tile, &start) {
                    piece[into * size..(into + len) * size]
                        .copy_from_slice(&bytes[at * size..(at + len) * size]);
                }
            }
            metrics::add(Metric::HostToDeviceBytes, piece.len() as u64);
            let device = client.device(device_index)?;
            buffers.push(Arc::new(
                client.buffer_from_host(&piece, dtype, &tile, &device)?,
            ));
        }
        Ok(Shards {
            devices: devices.to_vec(),
            dims: dims.to_vec(),
            sharding,
            buffers,
        })
    }

    /// The whole value's row-major bytes, gathered from one holder of each
    /// tile.
    pub fn to_host(&self, dtype: DType) -> Result<Vec<u8>> {
        let size = dtype.size_in_bytes();
        let numel: i64 = self.dims.iter().product();
        let mut all = vec![0u8; numel as usize * size];
        let tile = self.sharding.tile_dims(&self.dims);
        for holder in self.sharding.tile_holders() {
            let buffer = self.buffers.get(holder).ok_or_else(|| {
                Error::invalid("a sharded value's buffers", self.devices.len(), holder)
            })?;
            let piece = buffer.to_host()?;
            metrics::add(Metric::DeviceToHostBytes, piece.len() as u64);
            let index = self.sharding.tile_of(holder).unwrap_or_default();
            let start: Vec<i64> = index.iter().zip(&tile).map(|(i, t)| i * t).collect();
            for (at, from, len) in tile_runs(&self.dims, &tile, &start) {
                all[at * size..(at + len) * size]
                    .copy_from_slice(&piece[from * size..(from + len) * size]);
            }
        }
        Ok(all)
    }
}
