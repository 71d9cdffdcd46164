//! Indexing: advanced indexing (index.Tensor, index_put), scatter and its
//! reductions, masked fill/select, nonzero; triangular masks, flip, roll.
//!
//! Index tensors are read back to the host: a bad index must be a clear
//! error as on CPU, and boolean masks and nonzero have data-dependent
//! result sizes, so these ops synchronise with the device.

use super::{finish, is_float, op, wrap_dim, Form, OpDef};
use crate::builder::{Arg, Builder, TensorArg};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, ValueId};

pub(crate) use crate::builder::host_values;

fn row_major_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1];
    }
    strides
}

fn bytes_of(values: &[i64]) -> Vec<u8> {
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

/// The broadcast of several shapes, or an error naming them.
fn broadcast(op: &str, shapes: &[Vec<i64>]) -> Result<Vec<i64>> {
    let rank = shapes.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = vec![1i64; rank];
    for shape in shapes {
        let lead = rank - shape.len();
        for (i, &s) in shape.iter().enumerate() {
            let o = &mut out[lead + i];
            if *o == 1 {
                *o = s;
            } else if s != 1 && s != *o {
                return Err(Error::invalid(
                    format!("{op}: index shapes"),
                    "shapes that broadcast together",
                    format!("{shapes:?}"),
                ));
            }
        }
    }
    Ok(out)
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

/// Advanced indexing on the host: for `self` of `sizes` and the optional
/// index tensors, the result shape and each result element's flat source
/// index (negative indices wrapped, ranges checked).
fn advanced_index(b: &Builder, sizes: &[i64], list_index: usize) -> Result<(Vec<i64>, Vec<i64>)> {
    let items: Vec<Option<TensorArg>> = match b.arg(list_index)? {
        Arg::TensorList(items) => items.clone(),
        other => return Err(b.arg_error(list_index, "a Tensor?[]", other.kind())),
    };
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
            Some(t) => per_dim.push(Some((host_values(&t)?, t.view.sizes.clone()))),
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
    let bshape = broadcast(b.op_name(), &shapes)?;
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
    // Adjacent indexed dims keep their place; otherwise the broadcast dims lead.
    let adjacent = indexed.windows(2).all(|w| w[1] == w[0] + 1);
    let first = indexed.first().copied().unwrap_or(0);
    let rest: Vec<usize> = (0..sizes.len()).filter(|d| per_dim[*d].is_none()).collect();
    let (before, after): (Vec<usize>, Vec<usize>) = if adjacent {
        rest.iter().partition(|&&d| d < first)
    } else {
        (Vec::new(), rest.clone())
    };
    let mut out_shape: Vec<i64> = before.iter().map(|&d| sizes[d]).collect();
    out_shape.extend(&bshape);
    out_shape.extend(after.iter().map(|&d| sizes[d]));
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

/// index.Tensor(self, indices).
fn index(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (shape, flat) = advanced_index(b, &view.sizes, 1)?;
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[view.numel() as i64])?;
    let idx = b.host_tensor(bytes_of(&flat), DType::I64, &shape);
    let out = if view.numel() == 0 || flat.is_empty() {
        b.constant(Literal::Int(0), view.dtype, &shape)
    } else {
        b.flat_gather(x, idx)
    };
    b.output(out)
}

/// index_put(self, indices, values, accumulate) and its in-place forms.
fn index_put(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (shape, flat) = advanced_index(b, &view.sizes, 1)?;
    let accumulate = b.bool_arg(3)?;
    let x = b.tensor(0)?;
    if flat.is_empty() {
        return finish(b, form, x);
    }
    let v = b.tensor(2)?;
    let v = b.convert(v, view.dtype);
    let v = b.broadcast_to(v, &shape)?;
    let n = view.numel() as i64;
    let xf = b.reshape(x, &[n])?;
    let idx = b.host_tensor(bytes_of(&flat), DType::I64, &shape);
    let combine = accumulate.then_some(ReduceOp::Sum);
    let out = b.flat_scatter(xf, idx, v, combine);
    let out = b.reshape(out, &view.sizes)?;
    finish(b, form, out)
}

/// Flat indices into `self` for scatter/gather-style `index` along `dim`,
/// after checking the index values on the host.
fn scatter_indices(
    b: &mut Builder,
    self_sizes: &[i64],
    index: usize,
    dim: usize,
) -> Result<(ValueId, Vec<i64>)> {
    let t = b.tensor_arg(index)?.clone();
    let values = host_values(&t)?;
    let size = self_sizes.get(dim).copied().unwrap_or(1);
    if let Some(bad) = values.iter().find(|&&v| v < 0 || v >= size) {
        return Err(Error::invalid(
            format!("{}: index", b.op_name()),
            format!("indices in [0, {size})"),
            format!("index {bad} is out of bounds for dimension {dim} with size {size}"),
        ));
    }
    let ishape = if t.view.sizes.is_empty() {
        vec![1]
    } else {
        t.view.sizes.clone()
    };
    let sizes = if self_sizes.is_empty() {
        vec![1]
    } else {
        self_sizes.to_vec()
    };
    if ishape.len() != sizes.len()
        || ishape
            .iter()
            .zip(&sizes)
            .enumerate()
            .any(|(d, (i, s))| d != dim && i > s)
    {
        return Err(b.arg_error(
            index,
            format!(
                "an index of rank {} no larger than self outside dim {dim}",
                sizes.len()
            ),
            format!("{:?}", t.view.sizes),
        ));
    }
    let strides = row_major_strides(&sizes);
    let idx = b.tensor(index)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &ishape)?;
    let mut acc = b.constant(Literal::Int(0), DType::I64, &ishape);
    for (d, &stride) in strides.iter().enumerate() {
        let coord = if d == dim {
            idx
        } else {
            b.iota(DType::I64, &ishape, d)
        };
        let s = b.constant(Literal::Int(stride), DType::I64, &ishape);
        let term = b.binary(BinaryOp::Mul, coord, s)?;
        acc = b.binary(BinaryOp::Add, acc, term)?;
    }
    Ok((acc, ishape))
}

/// The scatter source: tensor `src` (sliced to the index shape) or a scalar.
fn scatter_source(b: &mut Builder, src: usize, dtype: DType, ishape: &[i64]) -> Result<ValueId> {
    if b.is_scalar(src) {
        let v = b.scalar_arg(src, dtype)?;
        return b.broadcast_to(v, ishape);
    }
    let sview = b.tensor_arg(src)?.view.clone();
    let s = b.tensor(src)?;
    let s = b.convert(s, dtype);
    let sdims = if sview.sizes.is_empty() {
        vec![1]
    } else {
        sview.sizes.clone()
    };
    let s = b.reshape(s, &sdims)?;
    if sdims.iter().zip(ishape).any(|(a, i)| a < i) {
        return Err(b.arg_error(
            src,
            format!("a source at least as large as the index {ishape:?}"),
            format!("{:?}", sview.sizes),
        ));
    }
    Ok(b.slice(s, &vec![0; ishape.len()], ishape, &vec![1; ishape.len()]))
}

/// scatter(self, dim, index, src|value[, reduce]) and scatter_add, with
/// `reduce` from a string argument at `reduce_index`.
fn scatter(b: &mut Builder, form: Form, reduce_index: Option<usize>, add: bool) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dim = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let combine = if add {
        Some(ReduceOp::Sum)
    } else {
        match reduce_index.map(|i| b.arg(i)).transpose()? {
            None | Some(Arg::None) => None,
            Some(Arg::Str(s)) if s == "add" || s == "sum" => Some(ReduceOp::Sum),
            Some(Arg::Str(s)) if s == "multiply" || s == "prod" => Some(ReduceOp::Prod),
            Some(other) => {
                return Err(b.arg_error(
                    reduce_index.unwrap_or(4),
                    "reduce='add' or 'multiply'",
                    other.kind(),
                ))
            }
        }
    };
    let (idx, ishape) = scatter_indices(b, &view.sizes, 2, dim)?;
    let src = scatter_source(b, 3, view.dtype, &ishape)?;
    let x = b.tensor(0)?;
    let n = view.numel() as i64;
    let xf = b.reshape(x, &[n])?;
    let out = b.flat_scatter(xf, idx, src, combine);
    let out = b.reshape(out, &view.sizes)?;
    finish(b, form, out)
}

/// scatter_reduce.two(self, dim, index, src, reduce, *, include_self).
fn scatter_reduce(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dim = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let (idx, ishape) = scatter_indices(b, &view.sizes, 2, dim)?;
    let src = scatter_source(b, 3, view.dtype, &ishape)?;
    let out = reduce_into(b, idx, src, 4, 5)?;
    finish(b, form, out)
}

/// Self (argument 0) with `src` reduced into the flat positions `idx` by
/// the reduce string at `reduce_index` (sum, prod, mean, amax, amin) and
/// include_self at `include_index`, shaped as self. Shared by scatter_reduce
/// and index_reduce.
pub(super) fn reduce_into(
    b: &mut Builder,
    idx: ValueId,
    src: ValueId,
    reduce_index: usize,
    include_index: usize,
) -> Result<ValueId> {
    let view = b.tensor_arg(0)?.view.clone();
    let reduce = match b.arg(reduce_index)? {
        Arg::Str(s) => s.clone(),
        other => return Err(b.arg_error(reduce_index, "a reduce string", other.kind())),
    };
    let include_self = b.bool_arg(include_index)?;
    let op = match reduce.as_str() {
        "sum" | "mean" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "amax" => ReduceOp::Max,
        "amin" => ReduceOp::Min,
        other => {
            return Err(b.arg_error(
                reduce_index,
                "reduce 'sum', 'prod', 'mean', 'amax' or 'amin'",
                format!("{other:?}"),
            ))
        }
    };
    let n = view.numel() as i64;
    let x = b.tensor(0)?;
    let xf = b.reshape(x, &[n])?;
    // Positions the index hits at least once.
    let zeros_i = b.constant(Literal::Int(0), DType::I64, &[n]);
    let ones_i = b.constant(Literal::Int(1), DType::I64, &b.dims(src));
    let hits = b.flat_scatter_add(zeros_i, idx, ones_i);
    let zero_i = b.constant(Literal::Int(0), DType::I64, &[n]);
    let hit = b.compare(CompareDir::Gt, hits, zero_i)?;
    let base = if include_self {
        xf
    } else {
        // Start hit positions from the reduction's identity.
        let identity = match (op, is_float(view.dtype)) {
            (ReduceOp::Sum, _) => Literal::Int(0),
            (ReduceOp::Prod, _) => Literal::Int(1),
            (ReduceOp::Max, true) => Literal::Float(f64::NEG_INFINITY),
            (ReduceOp::Max, false) => Literal::Int(i64::MIN),
            (_, true) => Literal::Float(f64::INFINITY),
            (_, false) => Literal::Int(i64::MAX),
        };
        let id = b.constant(identity, view.dtype, &[n]);
        b.select(hit, id, xf)?
    };
    let mut out = b.flat_scatter(base, idx, src, Some(op));
    if reduce == "mean" {
        let count = b.convert(hits, view.dtype);
        let count = if include_self {
            let one = b.constant(Literal::Int(1), view.dtype, &[n]);
            b.binary(BinaryOp::Add, count, one)?
        } else {
            count
        };
        let one = b.constant(Literal::Int(1), view.dtype, &[n]);
        let safe = b.select(hit, count, one)?;
        out = if is_float(view.dtype) {
            b.binary(BinaryOp::Div, out, safe)?
        } else {
            // Integer means round down, as in ATen.
            let q = b.binary(BinaryOp::Div, out, safe)?;
            let r = b.binary(BinaryOp::Rem, out, safe)?;
            let zero = b.constant(Literal::Int(0), view.dtype, &[n]);
            let inexact = b.compare(CompareDir::Ne, r, zero)?;
            let negative = b.compare(CompareDir::Lt, out, zero)?;
            let adjust = b.binary(BinaryOp::And, inexact, negative)?;
            let one = b.constant(Literal::Int(1), view.dtype, &[n]);
            let q1 = b.binary(BinaryOp::Sub, q, one)?;
            b.select(adjust, q1, q)?
        };
    }
    b.reshape(out, &view.sizes)
}

/// masked_scatter(self, mask, source): source's leading elements, in
/// order, where mask is set (synchronises to read the mask).
fn masked_scatter(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let mask = b.tensor_arg(1)?.clone();
    if mask.view.dtype != DType::Bool {
        return Err(b.arg_error(1, "a bool mask", mask.view.dtype));
    }
    let shape = broadcast(b.op_name(), &[view.sizes.clone(), mask.view.sizes.clone()])?;
    if form == Form::InPlace && shape != view.sizes {
        return Err(b.arg_error(
            1,
            format!("a mask broadcastable to {:?}", view.sizes),
            format!("{:?}", mask.view.sizes),
        ));
    }
    let values = host_values(&mask)?;
    let mut positions = Vec::new();
    let mut k = 0i64;
    for_each_index(&shape, |idx| {
        if broadcast_get(&values, &mask.view.sizes, idx) != 0 {
            positions.push(k);
        }
        k += 1;
    });
    let source_numel = b.tensor_arg(2)?.view.numel() as i64;
    let count = positions.len() as i64;
    if count > source_numel {
        return Err(b.arg_error(
            2,
            format!("at least {count} elements (the mask's set count)"),
            source_numel,
        ));
    }
    let x = b.tensor(0)?;
    let x = b.broadcast_to(x, &shape)?;
    let n: i64 = shape.iter().product();
    let xf = b.reshape(x, &[n])?;
    let src = b.tensor(2)?;
    let src = b.convert(src, view.dtype);
    let src = b.reshape(src, &[source_numel])?;
    let src = b.slice(src, &[0], &[count], &[1]);
    let idx = b.host_tensor(bytes_of(&positions), DType::I64, &[count]);
    let out = b.flat_scatter(xf, idx, src, None);
    let out = b.reshape(out, &shape)?;
    finish(b, form, out)
}

/// masked_fill(self, mask, value): value where mask, else self.
fn masked_fill(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let mask_dtype = b.tensor_arg(1)?.view.dtype;
    if mask_dtype != DType::Bool {
        return Err(b.arg_error(1, "a bool mask", mask_dtype));
    }
    let x = b.tensor(0)?;
    let m = b.tensor(1)?;
    let v = if b.is_scalar(2) {
        b.scalar_arg(2, view.dtype)?
    } else {
        let t = b.tensor_arg(2)?.view.clone();
        if !t.sizes.is_empty() {
            return Err(b.arg_error(2, "a 0-dimensional value", format!("sizes {:?}", t.sizes)));
        }
        let v = b.tensor(2)?;
        b.convert(v, view.dtype)
    };
    let shape = super::broadcast_shapes(b, &[view.sizes.clone(), b.dims(m)])?;
    if form == Form::InPlace && shape != view.sizes {
        return Err(b.arg_error(
            1,
            format!("a mask broadcastable to {:?}", view.sizes),
            format!("{:?}", b.dims(m)),
        ));
    }
    let x = b.broadcast_to(x, &shape)?;
    let m = b.broadcast_to(m, &shape)?;
    let v = b.broadcast_to(v, &shape)?;
    let out = b.select(m, v, x)?;
    finish(b, form, out)
}

/// masked_select(self, mask): the selected elements, 1-D (synchronises).
fn masked_select(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let mask = b.tensor_arg(1)?.clone();
    if mask.view.dtype != DType::Bool {
        return Err(b.arg_error(1, "a bool mask", mask.view.dtype));
    }
    let shape = broadcast(b.op_name(), &[view.sizes.clone(), mask.view.sizes.clone()])?;
    let values = host_values(&mask)?;
    let mut picked = Vec::new();
    let mut k = 0i64;
    for_each_index(&shape, |idx| {
        if broadcast_get(&values, &mask.view.sizes, idx) != 0 {
            picked.push(k);
        }
        k += 1;
    });
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

/// tril (`lower`) / triu(self, diagonal) on the last two dims.
fn triangle(b: &mut Builder, lower: bool, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let r = view.sizes.len();
    if r < 2 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "at least 2 dimensions",
            format!("{:?}", view.sizes),
        ));
    }
    let k = b.int_arg(1)?;
    let x = b.tensor(0)?;
    let row = b.iota(DType::I64, &view.sizes, r - 2);
    let col = b.iota(DType::I64, &view.sizes, r - 1);
    let diff = b.binary(BinaryOp::Sub, col, row)?;
    let kv = b.constant(Literal::Int(k), DType::I64, &view.sizes);
    let keep = b.compare(
        if lower {
            CompareDir::Le
        } else {
            CompareDir::Ge
        },
        diff,
        kv,
    )?;
    let zero = b.constant(Literal::Int(0), view.dtype, &view.sizes);
    let out = b.select(keep, x, zero)?;
    finish(b, form, out)
}

fn flip(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = b.int_list_arg(1)?;
    let mut wrapped: Vec<i64> = dims
        .iter()
        .map(|&d| wrap_dim(b, d, view.sizes.len()).map(|v| v as i64))
        .collect::<Result<_>>()?;
    wrapped.sort();
    wrapped.dedup();
    let x = b.tensor(0)?;
    let out = if view.sizes.is_empty() {
        x
    } else {
        b.reverse(x, &wrapped)
    };
    b.output(out)
}

/// roll(self, shifts, dims): with no dims, rolls the flattened tensor.
fn roll(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let shifts = b.int_list_arg(1)?;
    let dims = b.int_list_arg(2).unwrap_or_default();
    let mut x = b.tensor(0)?;
    let (work, pairs): (Vec<i64>, Vec<(i64, usize)>) = if dims.is_empty() {
        if shifts.len() != 1 {
            return Err(b.arg_error(1, "one shift when dims is empty", shifts.len()));
        }
        (vec![view.numel() as i64], vec![(shifts[0], 0)])
    } else {
        if shifts.len() != dims.len() {
            return Err(b.arg_error(
                1,
                format!("{} shifts (one per dim)", dims.len()),
                shifts.len(),
            ));
        }
        let pairs = shifts
            .iter()
            .zip(&dims)
            .map(|(&s, &d)| wrap_dim(b, d, view.sizes.len()).map(|d| (s, d)))
            .collect::<Result<_>>()?;
        (view.sizes.clone(), pairs)
    };
    x = b.reshape(x, &work)?;
    for (shift, d) in pairs {
        let n = work[d];
        if n == 0 {
            continue;
        }
        let s = shift.rem_euclid(n);
        if s == 0 {
            continue;
        }
        let zeros = vec![0; work.len()];
        let ones = vec![1; work.len()];
        let mut tail_start = zeros.clone();
        tail_start[d] = n - s;
        let mut head_limit = work.clone();
        head_limit[d] = n - s;
        let tail = b.slice(x, &tail_start, &work, &ones);
        let head = b.slice(x, &zeros, &head_limit, &ones);
        x = b.concat(&[tail, head], d)?;
    }
    let out = b.reshape(x, &view.sizes)?;
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::{Functional as F, InPlace as I};
    vec![
        op("aten::index.Tensor", index),
        op("aten::index.Tensor_out", index),
        op("aten::index_put", |b| index_put(b, F)),
        op("aten::index_put_", |b| index_put(b, I)),
        op("aten::_index_put_impl_", |b| index_put(b, I)),
        op("aten::scatter.src", |b| scatter(b, F, None, false)),
        op("aten::scatter_.src", |b| scatter(b, I, None, false)),
        op("aten::scatter.value", |b| scatter(b, F, None, false)),
        op("aten::scatter_.value", |b| scatter(b, I, None, false)),
        op("aten::scatter.reduce", |b| scatter(b, F, Some(4), false)),
        op("aten::scatter_.reduce", |b| scatter(b, I, Some(4), false)),
        op("aten::scatter.value_reduce", |b| {
            scatter(b, F, Some(4), false)
        }),
        op("aten::scatter_.value_reduce", |b| {
            scatter(b, I, Some(4), false)
        }),
        op("aten::scatter_add", |b| scatter(b, F, None, true)),
        op("aten::scatter_add_", |b| scatter(b, I, None, true)),
        op("aten::scatter_reduce.two", |b| scatter_reduce(b, F)),
        op("aten::scatter_reduce_.two", |b| scatter_reduce(b, I)),
        op("aten::masked_fill.Scalar", |b| masked_fill(b, F)),
        op("aten::masked_fill_.Scalar", |b| masked_fill(b, I)),
        op("aten::masked_fill.Tensor", |b| masked_fill(b, F)),
        op("aten::masked_fill_.Tensor", |b| masked_fill(b, I)),
        op("aten::masked_select", masked_select),
        op("aten::masked_scatter", |b| masked_scatter(b, F)),
        op("aten::masked_scatter_", |b| masked_scatter(b, I)),
        op("aten::nonzero", nonzero),
        op("aten::tril", |b| triangle(b, true, F)),
        op("aten::tril.out", |b| triangle(b, true, F)),
        op("aten::tril_", |b| triangle(b, true, I)),
        op("aten::triu", |b| triangle(b, false, F)),
        op("aten::triu.out", |b| triangle(b, false, F)),
        op("aten::triu_", |b| triangle(b, false, I)),
        op("aten::flip", flip),
        op("aten::roll", roll),
    ]
}
