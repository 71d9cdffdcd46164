//! Indexing reads: advanced indexing (index.Tensor, and index_put, which
//! shares its host-side index arithmetic), index_select, gather, take,
//! masked_select, nonzero.
//!
//! Index tensors are read back to the host: a bad index must be a clear
//! error as on CPU, and boolean masks and nonzero have data-dependent
//! result sizes, so these ops synchronise with the device.

use super::{
    at_least_1d, broadcast_shapes, broadcast_shapes_of, finish, is_float, wrap_dim, Arith, Form,
    OpDef,
};
use crate::builder::{Arg, Builder, TensorArg};
use crate::dims::Dims;
use crate::dtype::{Category, DType};
use crate::error::{Error, Result};
use crate::ir::{CompareDir, Literal, ReduceOp, ValueId};

pub(crate) use crate::builder::host_values;

fn row_major_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1];
    }
    strides
}

pub(super) fn bytes_of(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// Multi-index iteration over `sizes` in row-major order.
fn for_each_index(sizes: &[i64], mut f: impl FnMut(&[i64])) {
    if sizes.contains(&0) {
        return;
    }
    let mut index = vec![0i64; sizes.len()];
    loop {
        f(&index);
        let mut d = sizes.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < sizes[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// The element of `values` (of `shape`) seen at `index` of the broadcast shape.
fn broadcast_get(values: &[i64], shape: &[i64], index: &[i64]) -> i64 {
    let lead = index.len() - shape.len();
    let mut flat = 0i64;
    for (d, &s) in shape.iter().enumerate() {
        let i = if s == 1 { 0 } else { index[lead + d] };
        flat = flat * s + i;
    }
    values[flat as usize]
}

/// Advanced indexing: for `self` of `sizes` and the optional index tensors
/// of argument `list_index`, the result shape and each result element's
/// flat source index, an s64 value of that shape. Integer indices stay on
/// the device (range-checked as gather's are, negatives wrapped there), so
/// a captured graph that indexes replays without host reads; a bool mask
/// is read on the host, since its nonzeros decide the result's shape.
fn advanced_index(
    b: &mut Builder,
    sizes: &[i64],
    list_index: usize,
) -> Result<(Vec<i64>, ValueId)> {
    let items: Vec<Option<TensorArg>> = match b.arg(list_index)? {
        Arg::TensorList(items) => items.clone(),
        other => return Err(b.arg_error(list_index, "a Tensor?[]", other.kind())),
    };
    let masked = items
        .iter()
        .flatten()
        .any(|t| matches!(t.view.dtype, DType::Bool | DType::U8));
    if masked {
        let (shape, flat) = host_advanced_index(b, sizes, items)?;
        let positions = b.host_tensor(bytes_of(&flat), DType::I64, &shape);
        return Ok((shape, positions));
    }
    if items.len() > sizes.len() {
        return Err(Error::invalid(
            format!("{}: indices", b.op_name()),
            format!("at most {} (one per dim)", sizes.len()),
            items.len(),
        ));
    }
    let mut per_dim = items;
    per_dim.resize(sizes.len(), None);
    let indexed: Vec<usize> = (0..sizes.len()).filter(|&d| per_dim[d].is_some()).collect();
    let mut shapes = Vec::with_capacity(indexed.len());
    for &d in &indexed {
        let t = per_dim[d].as_ref().expect("an indexed dim");
        if is_float(t.view.dtype) || t.view.dtype.category() == Category::Complex {
            return Err(Error::invalid(
                format!("{}: indices", b.op_name()),
                "integer or bool index tensors",
                t.view.dtype,
            ));
        }
        let (op, size) = (b.op_name(), sizes[d]);
        b.check_range(t, (-size, size), None, |bad| {
            Error::invalid(
                format!("{op}: index"),
                format!("indices in [{}, {size})", -size),
                format!("index {bad} is out of bounds for dimension {d} with size {size}"),
            )
        })?;
        shapes.push(t.view.sizes.clone());
    }
    let bshape = broadcast_shapes_of(b, "index shapes", &shapes)?;
    let (out_shape, before, after) = index_layout(sizes, &indexed, &bshape);
    let strides = row_major_strides(sizes);
    let mut positions = b.constant(Literal::Int(0), DType::I64, &out_shape);
    let mut add_term = |b: &mut Builder, coordinate: ValueId, d: usize| -> Result<()> {
        let stride = b.constant(Literal::Int(strides[d]), DType::I64, &out_shape);
        let term = b.mul(coordinate, stride)?;
        positions = b.add(positions, term)?;
        Ok(())
    };
    for (axis, &d) in before.iter().enumerate() {
        let coordinate = b.iota(DType::I64, &out_shape, axis);
        add_term(b, coordinate, d)?;
    }
    let lead = before.len();
    let broadcast_axes: Vec<i64> = (lead..lead + bshape.len()).map(|a| a as i64).collect();
    for &d in &indexed {
        let t = per_dim[d].as_ref().expect("an indexed dim");
        let v = b.read(t)?;
        let v = b.convert(v, DType::I64);
        let dims = b.dims(v);
        let zero = b.constant(Literal::Int(0), DType::I64, &dims);
        let size = b.constant(Literal::Int(sizes[d]), DType::I64, &dims);
        let negative = b.compare(CompareDir::Lt, v, zero)?;
        let wrapped = b.add(v, size)?;
        let v = b.select(negative, wrapped, v)?;
        let v = b.broadcast_to(v, &bshape)?;
        let coordinate = b.broadcast_in_dim(v, &out_shape, &broadcast_axes);
        add_term(b, coordinate, d)?;
    }
    for (k, &d) in after.iter().enumerate() {
        let coordinate = b.iota(DType::I64, &out_shape, lead + bshape.len() + k);
        add_term(b, coordinate, d)?;
    }
    Ok((out_shape, positions))
}

/// Where advanced indexing puts the result's dims: the broadcast index
/// shape `bshape` stays at the indexed dims' place when they are adjacent,
/// else it leads. Returns the result shape and the self dims (not indexed)
/// before and after it.
fn index_layout(
    sizes: &[i64],
    indexed: &[usize],
    bshape: &[i64],
) -> (Vec<i64>, Vec<usize>, Vec<usize>) {
    let adjacent = indexed.windows(2).all(|w| w[1] == w[0] + 1);
    let first = indexed.first().copied().unwrap_or(0);
    let rest: Vec<usize> = (0..sizes.len()).filter(|d| !indexed.contains(d)).collect();
    let (before, after): (Vec<usize>, Vec<usize>) = if adjacent {
        rest.iter().partition(|&&d| d < first)
    } else {
        (Vec::new(), rest)
    };
    let mut out_shape: Vec<i64> = before.iter().map(|&d| sizes[d]).collect();
    out_shape.extend(bshape);
    out_shape.extend(after.iter().map(|&d| sizes[d]));
    (out_shape, before, after)
}

/// `advanced_index` with a bool mask among the indices, on the host.
fn host_advanced_index(
    b: &Builder,
    sizes: &[i64],
    items: Vec<Option<TensorArg>>,
) -> Result<(Vec<i64>, Vec<i64>)> {
    // One entry per self dim: None (a full slice) or (values, shape).
    let mut per_dim: Vec<Option<(Vec<i64>, Vec<i64>)>> = Vec::new();
    for item in items {
        match item {
            None => per_dim.push(None),
            Some(t) if matches!(t.view.dtype, DType::Bool | DType::U8) => {
                // A mask indexes as many dims as it has, by its nonzero coordinates.
                let mask = host_values(&t)?;
                let start = per_dim.len();
                let msizes = t.view.sizes.clone();
                if start + msizes.len() > sizes.len()
                    || msizes.iter().zip(&sizes[start..]).any(|(m, s)| m != s)
                {
                    return Err(Error::invalid(
                        format!("{}: mask", b.op_name()),
                        format!("a mask matching sizes {:?} at dim {start}", &sizes[start..]),
                        format!("{msizes:?}"),
                    ));
                }
                let mut coords: Vec<Vec<i64>> = vec![Vec::new(); msizes.len()];
                let mut k = 0;
                for_each_index(&msizes, |idx| {
                    if mask[k] != 0 {
                        for (d, &i) in idx.iter().enumerate() {
                            coords[d].push(i);
                        }
                    }
                    k += 1;
                });
                for c in coords {
                    let n = c.len() as i64;
                    per_dim.push(Some((c, vec![n])));
                }
            }
            Some(t) => per_dim.push(Some((host_values(&t)?, t.view.sizes.to_vec()))),
        }
    }
    if per_dim.len() > sizes.len() {
        return Err(Error::invalid(
            format!("{}: indices", b.op_name()),
            format!("at most {} (one per dim)", sizes.len()),
            per_dim.len(),
        ));
    }
    per_dim.resize(sizes.len(), None);
    let indexed: Vec<usize> = (0..sizes.len()).filter(|&d| per_dim[d].is_some()).collect();
    let shapes: Vec<Vec<i64>> = indexed
        .iter()
        .map(|&d| per_dim[d].as_ref().map(|p| p.1.clone()).unwrap_or_default())
        .collect();
    let bshape = broadcast_shapes_of(b, "index shapes", &shapes)?;
    for &d in &indexed {
        if let Some((values, _)) = &per_dim[d] {
            if let Some(bad) = values.iter().find(|&&v| v < -sizes[d] || v >= sizes[d]) {
                return Err(Error::invalid(
                    format!("{}: index", b.op_name()),
                    format!("indices in [{}, {})", -sizes[d], sizes[d]),
                    format!(
                        "index {bad} is out of bounds for dimension {d} with size {}",
                        sizes[d]
                    ),
                ));
            }
        }
    }
    let (out_shape, before, after) = index_layout(sizes, &indexed, &bshape);
    let strides = row_major_strides(sizes);
    let mut flat = Vec::with_capacity(out_shape.iter().product::<i64>().max(0) as usize);
    for_each_index(&out_shape, |idx| {
        let mut offset = 0i64;
        for (k, &d) in before.iter().enumerate() {
            offset += idx[k] * strides[d];
        }
        let bidx = &idx[before.len()..before.len() + bshape.len()];
        for &d in &indexed {
            if let Some((values, shape)) = &per_dim[d] {
                let v = broadcast_get(values, shape, bidx);
                offset += (if v < 0 { v + sizes[d] } else { v }) * strides[d];
            }
        }
        for (k, &d) in after.iter().enumerate() {
            offset += idx[before.len() + bshape.len() + k] * strides[d];
        }
        flat.push(offset);
    });
    Ok((out_shape, flat))
}

/// Row-major flat positions into a tensor of `dims` for every element of
/// a block of `block` dims: `index` (s64, of `block`) along `dim`, the
/// element's own coordinate along the other dims.
pub(super) fn flat_positions(
    b: &mut Builder,
    dims: &[i64],
    block: &[i64],
    dim: usize,
    index: ValueId,
) -> Result<ValueId> {
    let mut stride = 1i64;
    let mut flat = b.constant(Literal::Int(0), DType::I64, block);
    for axis in (0..dims.len()).rev() {
        let coord = if axis == dim {
            index
        } else {
            b.iota(DType::I64, block, axis)
        };
        let s = b.constant(Literal::Int(stride), DType::I64, block);
        let t = b.mul(coord, s)?;
        flat = b.add(flat, t)?;
        stride *= dims[axis];
    }
    Ok(flat)
}

/// Flat positions of per-plane indices (argument `index`, `per_plane` of
/// them in each of `planes` planes) in planes of `plane_size` elements.
pub(super) fn plane_positions(
    b: &mut Builder,
    index: usize,
    planes: i64,
    per_plane: i64,
    plane_size: i64,
) -> Result<ValueId> {
    let idx = b.tensor(index)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &[planes, per_plane])?;
    let plane = b.iota(DType::I64, &[planes, per_plane], 0);
    let size = b.constant(Literal::Int(plane_size), DType::I64, &[planes, per_plane]);
    let base = b.mul(plane, size)?;
    b.add(base, idx)
}

/// index.Tensor(self, indices).
fn index(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (shape, positions) = advanced_index(b, &view.sizes, 1)?;
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[view.numel() as i64])?;
    let out = if view.numel() == 0 || shape.contains(&0) {
        b.constant(Literal::Int(0), view.dtype, &shape)
    } else {
        b.flat_gather(x, positions)
    };
    b.output(out)
}

/// index_put(self, indices, values, accumulate) and its in-place forms.
fn index_put(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (shape, positions) = advanced_index(b, &view.sizes, 1)?;
    let accumulate = b.bool_arg(3)?;
    let x = b.tensor(0)?;
    if shape.contains(&0) {
        return finish(b, form, x);
    }
    let v = b.tensor(2)?;
    let v = b.convert(v, view.dtype);
    let v = b.broadcast_to(v, &shape)?;
    let n = view.numel() as i64;
    let xf = b.reshape(x, &[n])?;
    let idx = positions;
    let combine = accumulate.then_some(ReduceOp::Sum);
    let out = b.flat_scatter(xf, idx, v, combine);
    let out = b.reshape(out, &view.sizes)?;
    finish(b, form, out)
}

/// Checks every index is in `[-size, size)`: a bad index is a clear error.
pub(super) fn check_indices(b: &mut Builder, index: usize, size: i64) -> Result<()> {
    let t = b.tensor_arg(index)?;
    if matches!(t.view.dtype, DType::Bool) || is_float(t.view.dtype) {
        return Err(b.arg_error(index, "an integer index tensor", t.view.dtype));
    }
    let what = format!("{}: index", b.op_name());
    b.check_range(t, (-size, size), None, |bad| {
        Error::invalid(
            what.clone(),
            format!("indices in [{}, {size})", -size),
            format!("index {bad} out of range for a dimension of size {size}"),
        )
    })
}

/// Flat storage indices into `x_dims` (row-major) for an output of
/// `out_dims`, taking `index_value` (s64, of `out_dims`) along `dim` and the
/// output position elsewhere. Negative indices wrap.
pub(super) fn flat_indices(
    b: &mut Builder,
    x_dims: &[i64],
    out_dims: &[i64],
    dim: usize,
    index_value: ValueId,
) -> Result<ValueId> {
    let size = b.constant(Literal::Int(x_dims[dim]), DType::I64, out_dims);
    let zero = b.constant(Literal::Int(0), DType::I64, out_dims);
    let negative = b.compare(CompareDir::Lt, index_value, zero)?;
    let wrapped = b.add(index_value, size)?;
    let index_value = b.select(negative, wrapped, index_value)?;
    flat_positions(b, x_dims, out_dims, dim, index_value)
}

/// Flat positions in self (sizes `dims`) of every element of a block that
/// has self's shape except `index.len()` along `d`, placed at the indices
/// of argument 2 (checked on the device, negatives wrapped), so a graph
/// with index_copy_ (a static KV cache) needs no host read. Returns
/// (positions, block dims).
pub(super) fn along_positions(
    b: &mut Builder,
    dims: &[i64],
    d: usize,
) -> Result<(ValueId, Vec<i64>)> {
    let index = b.tensor_arg(2)?.view.clone();
    if index.sizes.len() > 1 {
        return Err(b.arg_error(2, "a 0-D or 1-D index", format!("sizes {:?}", index.sizes)));
    }
    check_indices(b, 2, dims[d])?;
    let k = index.numel() as i64;
    let mut upd_dims = dims.to_vec();
    upd_dims[d] = k;
    let idx = b.tensor(2)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &[k])?;
    let idx = b.broadcast_in_dim(idx, &upd_dims, &[d as i64]);
    let flat = flat_indices(b, dims, &upd_dims, d, idx)?;
    Ok((flat, upd_dims))
}

fn index_select(b: &mut Builder) -> Result<()> {
    let x_view = b.tensor_arg(0)?.view.clone();
    let x_dims = at_least_1d(&x_view.sizes);
    let dim = wrap_dim(b, b.int_arg(1)?, x_view.sizes.len())?;
    let (flat_index, out_dims) = along_positions(b, &x_dims, dim)?;
    let x = b.tensor(0)?;
    let flat = b.reshape(x, &[x_view.numel() as i64])?;
    let out = b.flat_gather(flat, flat_index);
    let final_dims = if x_view.sizes.is_empty() {
        vec![]
    } else {
        out_dims
    };
    let out = b.reshape(out, &final_dims)?;
    b.output(out)
}

fn gather(b: &mut Builder) -> Result<()> {
    let x_view = b.tensor_arg(0)?.view.clone();
    let index_view = b.tensor_arg(2)?.view.clone();
    let rank = x_view.sizes.len();
    let dim = wrap_dim(b, b.int_arg(1)?, rank)?;
    if index_view.numel() == 0 {
        // An empty index selects nothing, whatever its rank (as in ATen).
        let out = b.constant(Literal::Int(0), x_view.dtype, &index_view.sizes);
        return b.output(out);
    }
    // A 0-d tensor counts as 1-D here, as in ATen.
    let (x_dims, out_dims) = (at_least_1d(&x_view.sizes), at_least_1d(&index_view.sizes));
    if out_dims.len() != x_dims.len() {
        return Err(b.arg_error(
            2,
            format!("an index of rank {rank}"),
            format!("rank {}", index_view.sizes.len()),
        ));
    }
    for d in 0..x_dims.len() {
        if d != dim && out_dims[d] > x_dims[d] {
            return Err(b.arg_error(
                2,
                format!("size <= {} in dimension {d}", x_dims[d]),
                out_dims[d],
            ));
        }
    }
    check_indices(b, 2, x_dims[dim])?;
    let idx = b.tensor(2)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &out_dims)?;
    let flat_index = flat_indices(b, &x_dims, &out_dims, dim, idx)?;
    let x = b.tensor(0)?;
    let flat = b.reshape(x, &[x_view.numel() as i64])?;
    let out = b.flat_gather(flat, flat_index);
    let out = b.reshape(out, &index_view.sizes)?;
    b.output(out)
}

/// take(self, index): elements of the flattened input.
fn take(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let index = b.tensor_arg(1)?.view.clone();
    let n = view.numel() as i64;
    check_indices(b, 1, n)?;
    let idx = b.tensor(1)?;
    let idx = b.convert(idx, DType::I64);
    let size = b.constant(Literal::Int(n), DType::I64, &index.sizes);
    let zero = b.constant(Literal::Int(0), DType::I64, &index.sizes);
    let negative = b.compare(CompareDir::Lt, idx, zero)?;
    let wrapped = b.add(idx, size)?;
    let idx = b.select(negative, wrapped, idx)?;
    let x = b.tensor(0)?;
    let flat = b.reshape(x, &[n])?;
    let out = b.flat_gather(flat, idx);
    b.output(out)
}

/// The bool mask (argument 1) and the shape it and self (argument 0)
/// broadcast to, which in place must be self's.
pub(super) fn bool_mask(b: &Builder, form: Form) -> Result<(TensorArg, Dims)> {
    let sizes = b.tensor_arg(0)?.view.sizes.clone();
    let mask = b.tensor_arg(1)?.clone();
    if mask.view.dtype != DType::Bool {
        return Err(b.arg_error(1, "a bool mask", mask.view.dtype));
    }
    let shape = broadcast_shapes(b, &[sizes.clone(), mask.view.sizes.clone()])?;
    if form == Form::InPlace && shape != sizes {
        return Err(b.arg_error(
            1,
            format!("a mask broadcastable to {sizes:?}"),
            format!("{:?}", mask.view.sizes),
        ));
    }
    Ok((mask, shape))
}

/// The row-major positions in `shape` where `mask`, broadcast to it, is
/// set (read on the host).
pub(super) fn mask_positions(mask: &TensorArg, shape: &[i64]) -> Result<Vec<i64>> {
    let values = host_values(mask)?;
    let mut positions = Vec::new();
    let mut k = 0i64;
    for_each_index(shape, |idx| {
        if broadcast_get(&values, &mask.view.sizes, idx) != 0 {
            positions.push(k);
        }
        k += 1;
    });
    Ok(positions)
}

/// masked_select(self, mask): the selected elements, 1-D (synchronises).
fn masked_select(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (mask, shape) = bool_mask(b, Form::Functional)?;
    let picked = mask_positions(&mask, &shape)?;
    let x = b.tensor(0)?;
    let x = b.broadcast_to(x, &shape)?;
    let total: i64 = shape.iter().product();
    let flat = b.reshape(x, &[total])?;
    let count = picked.len() as i64;
    let out = if count == 0 {
        b.constant(Literal::Int(0), view.dtype, &[0])
    } else {
        let idx = b.host_tensor(bytes_of(&picked), DType::I64, &[count]);
        b.flat_gather(flat, idx)
    };
    b.output(out)
}

/// nonzero(self): [n, ndim] int64 coordinates (synchronises).
fn nonzero(b: &mut Builder) -> Result<()> {
    let t = b.tensor_arg(0)?.clone();
    let bytes = t.storage.read_view(&t.view)?;
    let size = t.view.dtype.size_in_bytes();
    let mut coords = Vec::new();
    let mut k = 0usize;
    let mut count = 0i64;
    for_each_index(&t.view.sizes, |idx| {
        if bytes[k * size..(k + 1) * size]
            .iter()
            .any(|&byte| byte != 0)
        {
            // A float -0.0 has a sign bit set but is zero.
            let is_negative_zero = match t.view.dtype {
                DType::F32 => {
                    f32::from_ne_bytes(bytes[k * 4..k * 4 + 4].try_into().unwrap_or([0; 4])) == 0.0
                }
                DType::F64 => {
                    f64::from_ne_bytes(bytes[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8])) == 0.0
                }
                DType::F16 | DType::BF16 => {
                    (u16::from_ne_bytes([bytes[k * 2], bytes[k * 2 + 1]]) & 0x7FFF) == 0
                }
                _ => false,
            };
            if !is_negative_zero {
                coords.extend_from_slice(idx);
                count += 1;
            }
        }
        k += 1;
    });
    let rank = t.view.sizes.len() as i64;
    let out = if coords.is_empty() {
        b.constant(Literal::Int(0), DType::I64, &[count, rank])
    } else {
        b.host_tensor(bytes_of(&coords), DType::I64, &[count, rank])
    };
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::{Functional as F, InPlace as I};
    let mut ops = vec![
        op!("aten::index_put", index_put(F)),
        op!("aten::index_put_", index_put(I)),
        op!("aten::_index_put_impl_", index_put(I)),
        op!("aten::masked_select", masked_select()),
        op!("aten::nonzero", nonzero()),
    ];
    ops.extend(out_overloads!("aten::index", ["Tensor"], index()));
    ops.extend(with_out!("aten::index_select", index_select()));
    ops.extend(with_out!("aten::gather", gather()));
    ops.extend(with_out!("aten::take", take()));
    ops
}
