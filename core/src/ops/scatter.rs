//! Indexed writes: scatter and its reductions, index_add/copy/fill/reduce,
//! masked_fill and masked_scatter, and the embedding backward.

use super::index::{
    along_positions, bool_mask, bytes_of, flat_positions, host_values, mask_positions,
};
use super::{
    at_least_1d, broadcast_scalar, finish, float_input, is_float, wrap_dim, Arith, Form, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, ValueId};

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
    let ishape = at_least_1d(&t.view.sizes);
    let sizes = at_least_1d(self_sizes);
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
    let idx = b.tensor(index)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &ishape)?;
    let flat = flat_positions(b, &sizes, &ishape, dim, idx)?;
    Ok((flat, ishape))
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
    let sdims = at_least_1d(&sview.sizes);
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
fn scatter(b: &mut Builder, reduce_index: Option<usize>, add: bool, form: Form) -> Result<()> {
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
    if matches!(op, ReduceOp::Max | ReduceOp::Min) && is_float(view.dtype) {
        // A NaN from self or src makes its position NaN, as in ATen; XLA's
        // combiner skips it, so the NaNs are scattered apart and selected in.
        let base_nan = b.is_nan(base)?;
        let src_nan = b.is_nan(src)?;
        let nan = b.flat_scatter(base_nan, idx, src_nan, Some(ReduceOp::Or));
        let nan_value = b.float_like(f64::NAN, out);
        out = b.select(nan, nan_value, out)?;
    }
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
    let (mask, shape) = bool_mask(b, form)?;
    let positions = mask_positions(&mask, &shape)?;
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
    let (_, shape) = bool_mask(b, form)?;
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
    let x = b.broadcast_to(x, &shape)?;
    let m = b.broadcast_to(m, &shape)?;
    let v = b.broadcast_to(v, &shape)?;
    let out = b.select(m, v, x)?;
    finish(b, form, out)
}

/// What index_add/index_copy/index_fill write along `dim` at `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Along {
    Add,
    Copy,
    Fill,
}

/// index_add/index_copy/index_fill along `dim` at `index`.
fn index_along(b: &mut Builder, kind: Along, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = at_least_1d(&view.sizes);
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let (flat, upd_dims) = along_positions(b, &dims, d)?;
    let updates = match kind {
        Along::Fill => {
            let v = if b.is_scalar(3) {
                b.scalar_arg(3, view.dtype)?
            } else {
                let t = b.tensor(3)?;
                b.convert(t, view.dtype)
            };
            b.broadcast_to(v, &upd_dims)?
        }
        _ => {
            let s = b.tensor(3)?;
            let s = b.convert(s, view.dtype);
            let s = b.reshape(s, &upd_dims)?;
            if kind == Along::Add && !matches!(b.arg(4), Ok(Arg::Int(1)) | Err(_)) {
                let alpha = broadcast_scalar(b, 4, view.dtype, &upd_dims)?;
                b.mul(s, alpha)?
            } else {
                s
            }
        }
    };
    let x = b.tensor(0)?;
    let n = view.numel() as i64;
    let xf = b.reshape(x, &[n])?;
    let combine = (kind == Along::Add).then_some(ReduceOp::Sum);
    let out = b.flat_scatter(xf, flat, updates, combine);
    let out = b.reshape(out, &view.sizes)?;
    finish(b, form, out)
}

/// index_reduce(self, dim, index, source, reduce, *, include_self).
fn index_reduce(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = at_least_1d(&view.sizes);
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let (flat, upd_dims) = along_positions(b, &dims, d)?;
    let src = b.tensor(3)?;
    let src = b.convert(src, view.dtype);
    let src = b.reshape(src, &upd_dims)?;
    let out = reduce_into(b, flat, src, 4, 5)?;
    finish(b, form, out)
}

/// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
/// scale_grad_by_freq): rows of grad scatter-added at their indices.
fn embedding_dense_backward(b: &mut Builder) -> Result<()> {
    let (g, dtype, gdims) = float_input(b, 0)?;
    let index_view = b.tensor_arg(1)?.view.clone();
    let num_weights = b.int_arg(2)?;
    let padding_idx = b.int_arg(3)?;
    let scale_by_freq = b.bool_arg(4)?;
    let d = *gdims
        .last()
        .ok_or_else(|| b.arg_error(0, "a gradient of rank >= 1", "a scalar"))?;
    let n = index_view.numel() as i64;
    let g = b.reshape(g, &[n, d])?;
    let idx = b.tensor(1)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &[n])?;
    let mut rows = g;
    let pad = b.constant(Literal::Int(padding_idx), DType::I64, &[n]);
    let not_pad = b.compare(CompareDir::Ne, idx, pad)?;
    let zero = b.constant(Literal::Int(0), dtype, &[n]);
    let one = b.constant(Literal::Int(1), dtype, &[n]);
    let keep = b.select(not_pad, one, zero)?;
    if scale_by_freq {
        // Divide each row by how often its index occurs.
        let counts = b.constant(Literal::Int(0), dtype, &[num_weights]);
        let counts = b.flat_scatter_add(counts, idx, one);
        let per_row = b.flat_gather(counts, idx);
        let scale = b.binary(BinaryOp::Div, keep, per_row)?;
        let scale = b.broadcast_in_dim(scale, &[n, d], &[0]);
        rows = b.mul(rows, scale)?;
    } else {
        let keep = b.broadcast_in_dim(keep, &[n, d], &[0]);
        rows = b.mul(rows, keep)?;
    }
    let row_index = b.broadcast_in_dim(idx, &[n, d], &[0]);
    let width = b.constant(Literal::Int(d), DType::I64, &[n, d]);
    let base = b.mul(row_index, width)?;
    let col = b.iota(DType::I64, &[n, d], 1);
    let flat_index = b.add(base, col)?;
    let out = b.constant(Literal::Int(0), dtype, &[num_weights * d]);
    let out = b.flat_scatter_add(out, flat_index, rows);
    let out = b.reshape(out, &[num_weights, d])?;
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::{Functional as F, InPlace as I};
    let mut ops = vec![
        op!("aten::scatter.src", scatter(None, false, F)),
        op!("aten::scatter_.src", scatter(None, false, I)),
        op!("aten::scatter.value", scatter(None, false, F)),
        op!("aten::scatter_.value", scatter(None, false, I)),
        op!("aten::scatter.reduce", scatter(Some(4), false, F)),
        op!("aten::scatter_.reduce", scatter(Some(4), false, I)),
        op!("aten::scatter.value_reduce", scatter(Some(4), false, F)),
        op!("aten::scatter_.value_reduce", scatter(Some(4), false, I)),
        op!("aten::scatter_add", scatter(None, true, F)),
        op!("aten::scatter_add_", scatter(None, true, I)),
        op!("aten::scatter_reduce.two", scatter_reduce(F)),
        op!("aten::scatter_reduce_.two", scatter_reduce(I)),
        op!("aten::masked_fill.Scalar", masked_fill(F)),
        op!("aten::masked_fill_.Scalar", masked_fill(I)),
        op!("aten::masked_fill.Tensor", masked_fill(F)),
        op!("aten::masked_fill_.Tensor", masked_fill(I)),
        op!("aten::masked_scatter", masked_scatter(F)),
        op!("aten::masked_scatter_", masked_scatter(I)),
        op!("aten::index_fill.int_Scalar", index_along(Along::Fill, F)),
        op!("aten::index_fill_.int_Scalar", index_along(Along::Fill, I)),
        op!("aten::index_fill.int_Tensor", index_along(Along::Fill, F)),
        op!("aten::index_fill_.int_Tensor", index_along(Along::Fill, I)),
        op!("aten::embedding_dense_backward", embedding_dense_backward()),
    ];
    ops.extend(forms!("aten::index_add", index_along(Along::Add)));
    ops.extend(forms!("aten::index_copy", index_along(Along::Copy)));
    ops.extend(forms!("aten::index_reduce", index_reduce()));
    ops
}
