//! `rtpu_sharding`: how a storage's value is split over the devices of a
//! mesh. A sharded storage holds one buffer per mesh device; programs that
//! read it run as one SPMD program partitioned over the mesh, and host
//! reads gather it.

use rtpu_core::sharding::Sharding;

use crate::boundary::{check_struct_size, fallible, non_null, out_ptr, slice, Out};
use crate::buffer::dtype_from_c;
use crate::error::{rtpu_error, FfiError};
use crate::storage::{rtpu_storage, storage_ref};

/// A value split over a mesh: cut into `tiles[d]` equal tiles along each
/// dim `d` of `dims`, each tile held by `replicas` partitions. Passed to
/// `rtpu_storage_shard` (read only) and filled by `rtpu_storage_sharding`.
#[repr(C)]
pub struct rtpu_sharding {
    /// Set to `RTPU_SHARDING_STRUCT_SIZE`.
    pub struct_size: usize,
    /// The mesh: `num_devices` device indices of the runtime, distinct.
    /// Partition `p` of a program runs on `devices[p]`.
    pub devices: *mut usize,
    pub num_devices: usize,
    /// `rank` dims of the value as split; their product is the storage's
    /// element count.
    pub dims: *mut i64,
    /// `rank` tile counts, each >= 1 and dividing its dim.
    pub tiles: *mut i64,
    pub rank: usize,
    /// Copies of each tile, >= 1.
    pub replicas: i64,
    /// The partition holding each (tile, copy), row-major over the tiles
    /// and then the copy: product(tiles) * replicas distinct partitions.
    pub partitions: *mut usize,
    pub num_partitions: usize,
}

/// `sizeof(rtpu_sharding)`.
pub const RTPU_SHARDING_STRUCT_SIZE: usize = 72;

/// Splits the value of `storage`, read as `dtype` (one of
/// `RTPU_DTYPE_*`), over the mesh `sharding` describes (read only during
/// the call), copying each device its tile. The storage stays split until
/// a write changes its size. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_shard(
    storage: *const rtpu_storage,
    dtype: u32,
    sharding: *const rtpu_sharding,
) -> *mut rtpu_error {
    fallible("rtpu_storage_shard", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let storage = unsafe { storage_ref(storage, "storage") }?;
        // SAFETY: a non-NULL struct is readable per the docs.
        let desc = unsafe { non_null(sharding, "sharding") }?;
        check_struct_size("rtpu_sharding", desc.struct_size, RTPU_SHARDING_STRUCT_SIZE)?;
        let dtype = dtype_from_c(dtype)?;
        // SAFETY: each array holds its count of elements per the docs.
        let (devices, dims, tiles, partitions) = unsafe {
            (
                slice(desc.devices, desc.num_devices, "sharding.devices")?,
                slice(desc.dims, desc.rank, "sharding.dims")?,
                slice(desc.tiles, desc.rank, "sharding.tiles")?,
                slice(desc.partitions, desc.num_partitions, "sharding.partitions")?,
            )
        };
        let mut seen = devices.to_vec();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != devices.len() || devices.is_empty() {
            return Err(FfiError::invalid(format!(
                "sharding.devices: expected distinct device indices, got {devices:?}"
            )));
        }
        let sharding = Sharding::new(
            tiles.to_vec(),
            desc.replicas,
            partitions.to_vec(),
            devices.len(),
        )?;
        storage.shard(dtype, devices, dims, sharding)?;
        Ok(())
    })
}

/// Writes to `*sharded_out` whether `storage` is split over a mesh (its
/// pending value computed first). When it is, fills `*sharding_out`: its
/// counts (`num_devices`, `rank`, `num_partitions`) and `replicas` always,
/// and each array whose pointer is non-NULL (sized from a first call with
/// NULL arrays; a count given smaller than the one written is
/// INVALID_ARGUMENT). Set `sharding_out->struct_size` first. Thread-safe.
#[no_mangle]
pub extern "C" fn rtpu_storage_sharding(
    storage: *const rtpu_storage,
    sharded_out: *mut bool,
    sharding_out: *mut rtpu_sharding,
) -> *mut rtpu_error {
    fallible("rtpu_storage_sharding", || {
        // SAFETY: a non-NULL handle is live per the docs.
        let storage = unsafe { storage_ref(storage, "storage") }?;
        let sharded_out = Out::new(sharded_out, "sharded_out")?;
        let sharding_out = out_ptr(sharding_out, "sharding_out")?;
        // SAFETY: non-NULL and writable per the docs.
        let out = unsafe { &mut *sharding_out };
        check_struct_size("rtpu_sharding", out.struct_size, RTPU_SHARDING_STRUCT_SIZE)?;
        let Some(shards) = storage.shards()? else {
            sharded_out.write(false);
            return Ok(());
        };
        let sharding = &shards.sharding;
        let rank = shards.dims.len();
        room(
            out.devices.is_null(),
            out.num_devices,
            shards.devices.len(),
            "sharding.devices",
        )?;
        room(out.dims.is_null(), out.rank, rank, "sharding.dims")?;
        room(out.tiles.is_null(), out.rank, rank, "sharding.tiles")?;
        let partitions = sharding.partitions.len();
        room(
            out.partitions.is_null(),
            out.num_partitions,
            partitions,
            "sharding.partitions",
        )?;
        // SAFETY: each non-NULL array has room, checked above.
        unsafe {
            fill(out.devices, &shards.devices);
            fill(out.dims, &shards.dims);
            fill(out.tiles, &sharding.tiles);
            fill(out.partitions, &sharding.partitions);
        }
        out.num_devices = shards.devices.len();
        out.rank = shards.dims.len();
        out.replicas = sharding.replicas;
        out.num_partitions = sharding.partitions.len();
        sharded_out.write(true);
        Ok(())
    })
}

/// Checks that a caller's array (unless NULL) has room for `needed`.
fn room(null: bool, capacity: usize, needed: usize, what: &str) -> Result<(), FfiError> {
    if !null && capacity < needed {
        return Err(FfiError::invalid(format!(
            "{what}: expected room for {needed} elements, got {capacity}"
        )));
    }
    Ok(())
}

/// Copies `values` into the caller's array `dst` unless it is NULL.
///
/// # Safety
/// A non-NULL `dst` must have room for `values.len()` elements.
unsafe fn fill<T: Copy>(dst: *mut T, values: &[T]) {
    if !dst.is_null() {
        // SAFETY: guaranteed by the caller.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), dst, values.len()) };
    }
}
