//! Normalisation: layer, batch and group norm, with backwards. Statistics
//! are computed in float32 for 16-bit inputs, as ATen does.

use super::{accumulate_dtype, broadcast_scalar, float_input, output_if, Arith, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, ReduceOp, UnaryOp, ValueId};

/// Optional tensor argument `index` as a value of `dtype`, reshaped to `dims`.
fn optional(b: &mut Builder, index: usize, dtype: DType, dims: &[i64]) -> Result<Option<ValueId>> {
    if b.opt_tensor_arg(index)?.is_none() {
        return Ok(None);
    }
    let v = b.tensor(index)?;
    let v = b.convert(v, dtype);
    Ok(Some(b.reshape(v, dims)?))
}

/// Tensor argument `index`, which must be present (`what` says why), as
/// `optional` reads it.
fn required(
    b: &mut Builder,
    index: usize,
    dtype: DType,
    dims: &[i64],
    what: &str,
) -> Result<ValueId> {
    optional(b, index, dtype, dims)?.ok_or_else(|| b.arg_error(index, what, "None"))
}

/// `output_mask` (bool[3]) at `index`; absent means all.
fn output_mask(b: &Builder, index: usize) -> Result<[bool; 3]> {
    match b.arg(index) {
        Ok(Arg::IntList(v)) if v.len() == 3 => Ok([v[0] != 0, v[1] != 0, v[2] != 0]),
        Ok(Arg::None) | Err(_) => Ok([true; 3]),
        Ok(other) => Err(b.arg_error(index, "output_mask of 3 bools", other.kind())),
    }
}

/// Mean over `dims` of `x`, kept broadcastable to x's shape.
fn mean_keep(b: &mut Builder, x: ValueId, dims: &[i64]) -> Result<ValueId> {
    let shape = b.dims(x);
    let count: i64 = dims.iter().map(|&d| shape[d as usize]).product();
    let s = b.reduce(x, ReduceOp::Sum, dims);
    let n = b.constant(Literal::Int(count), b.dtype(s), &b.dims(s));
    let m = b.binary(BinaryOp::Div, s, n)?;
    let keep: Vec<i64> = (0..shape.len() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    Ok(b.broadcast_in_dim(m, &shape, &keep))
}

/// The mean of `x` over `axis` and `rstd` (with eps at `eps_index`), both
/// kept broadcastable, and `x - mean`.
fn moments(
    b: &mut Builder,
    x: ValueId,
    axis: i64,
    eps_index: usize,
) -> Result<(ValueId, ValueId, ValueId)> {
    let mean = mean_keep(b, x, &[axis])?;
    let centered = b.sub(x, mean)?;
    let sq = b.mul(centered, centered)?;
    let var = mean_keep(b, sq, &[axis])?;
    let rstd = inv_std(b, var, eps_index)?;
    Ok((mean, centered, rstd))
}

/// `y * weight + bias` for the optional weight and bias (arguments `first`
/// and `first + 1`, of `size` elements) along dim 1 of `y`, in y's dtype.
fn affine(b: &mut Builder, y: ValueId, first: usize, size: i64) -> Result<ValueId> {
    let (dtype, dims) = (b.dtype(y), b.dims(y));
    let mut y = y;
    if let Some(w) = optional(b, first, dtype, &[size])? {
        let w = b.broadcast_in_dim(w, &dims, &[1]);
        y = b.mul(y, w)?;
    }
    if let Some(bias) = optional(b, first + 1, dtype, &[size])? {
        let bias = b.broadcast_in_dim(bias, &dims, &[1]);
        y = b.add(y, bias)?;
    }
    Ok(y)
}

/// 1 / sqrt(var + eps), with eps a device input.
fn inv_std(b: &mut Builder, var: ValueId, eps_index: usize) -> Result<ValueId> {
    let eps = b.scalar_arg(eps_index, b.dtype(var))?;
    let eps = b.broadcast_to(eps, &b.dims(var))?;
    let v = b.add(var, eps)?;
    Ok(b.unary(UnaryOp::Rsqrt, v))
}

/// native_layer_norm(input, normalized_shape, weight?, bias?, eps).
fn layer_norm(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let normalized = b.int_list_arg(1)?;
    let axis = dims
        .len()
        .checked_sub(normalized.len())
        .filter(|&a| dims[a..] == normalized[..])
        .ok_or_else(|| {
            Error::invalid(
                "aten::native_layer_norm: normalized_shape",
                format!("a suffix of the input's sizes {dims:?}"),
                format!("{normalized:?}"),
            )
        })?;
    let cd = accumulate_dtype(dtype);
    let m: i64 = dims[..axis].iter().product();
    let n: i64 = normalized.iter().product();
    let x = b.convert(x, cd);
    let x = b.reshape(x, &[m, n])?;
    let (mean, centered, rstd) = moments(b, x, 1, 4)?;
    let y = b.mul(centered, rstd)?;
    let y = affine(b, y, 2, n)?;
    let y = b.reshape(y, &dims)?;
    let y = b.convert(y, dtype);
    b.output(y)?;
    let stat_dims: Vec<i64> = dims[..axis]
        .iter()
        .copied()
        .chain(std::iter::repeat_n(1, normalized.len()))
        .collect();
    for stat in [mean, rstd] {
        let s = b.slice(stat, &[0, 0], &[m, 1], &[1, 1]);
        let s = b.reshape(s, &stat_dims)?;
        let s = b.convert(s, dtype);
        b.output(s)?;
    }
    Ok(())
}

/// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
/// weight?, bias?, output_mask).
fn layer_norm_backward(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 1)?;
    let normalized = b.int_list_arg(2)?;
    let axis = dims.len().saturating_sub(normalized.len());
    let mask = output_mask(b, 7)?;
    let cd = accumulate_dtype(dtype);
    let (m, n) = (
        dims[..axis].iter().product::<i64>(),
        normalized.iter().product::<i64>(),
    );
    let g = b.tensor(0)?;
    let g = b.convert(g, cd);
    let g = b.reshape(g, &[m, n])?;
    let x = b.convert(x, cd);
    let x = b.reshape(x, &[m, n])?;
    let (xhat, rstd) = saved_xhat(b, x, 3, cd, &[m], &[0])?;
    let weight = optional(b, 5, cd, &[n])?;
    output_if(b, mask[0], |b| {
        let gw = match weight {
            Some(w) => {
                let w = b.broadcast_in_dim(w, &[m, n], &[1]);
                b.mul(g, w)?
            }
            None => g,
        };
        let gi = normalized_input_grad(b, gw, xhat, rstd, 1)?;
        let gi = b.reshape(gi, &dims)?;
        Ok(b.convert(gi, dtype))
    })?;
    for (k, param) in [(1usize, 5usize), (2, 6)] {
        let present = b.opt_tensor_arg(param)?.map(|t| t.view.clone());
        match present {
            Some(view) if mask[k] => {
                let term = if k == 1 { b.mul(g, xhat)? } else { g };
                let s = b.reduce(term, ReduceOp::Sum, &[0]);
                let s = b.reshape(s, &view.sizes)?;
                let s = b.convert(s, view.dtype);
                b.output(s)?;
            }
            _ => b.none_output(),
        }
    }
    Ok(())
}

/// xhat = (x - mean) rstd from the forward's saved mean and rstd
/// (arguments `stats` and `stats + 1`, of `stat_dims`, broadcast along
/// `keep` to x's dims); returns xhat and the broadcast rstd.
fn saved_xhat(
    b: &mut Builder,
    x: ValueId,
    stats: usize,
    cd: DType,
    stat_dims: &[i64],
    keep: &[i64],
) -> Result<(ValueId, ValueId)> {
    let dims = b.dims(x);
    let mean = required(b, stats, cd, stat_dims, "the forward's mean")?;
    let rstd = required(b, stats + 1, cd, stat_dims, "the forward's rstd")?;
    let mean = b.broadcast_in_dim(mean, &dims, keep);
    let rstd = b.broadcast_in_dim(rstd, &dims, keep);
    let centered = b.sub(x, mean)?;
    let xhat = b.mul(centered, rstd)?;
    Ok((xhat, rstd))
}

/// rstd (gw - mean(gw) - xhat mean(gw xhat)), means over `axis`: the input
/// gradient of a normalisation, with `gw` the weight-scaled gradient.
fn normalized_input_grad(
    b: &mut Builder,
    gw: ValueId,
    xhat: ValueId,
    rstd: ValueId,
    axis: i64,
) -> Result<ValueId> {
    let a = mean_keep(b, gw, &[axis])?;
    let gx = b.mul(gw, xhat)?;
    let c = mean_keep(b, gx, &[axis])?;
    let xc = b.mul(xhat, c)?;
    let d = b.sub(gw, a)?;
    let d = b.sub(d, xc)?;
    b.mul(rstd, d)
}

/// Dims reduced by batch norm: all but the channel dim 1.
fn batch_dims(rank: usize) -> Vec<i64> {
    (0..rank as i64).filter(|&d| d != 1).collect()
}

/// A per-channel value of [C] broadcast to the input's shape.
fn per_channel(b: &mut Builder, v: ValueId, dims: &[i64]) -> ValueId {
    b.broadcast_in_dim(v, dims, &[1])
}

/// native_batch_norm(input, weight?, bias?, running_mean?, running_var?,
/// training, momentum, eps) -> (out, save_mean, save_invstd); training
/// updates the running statistics in place.
fn batch_norm(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    require_batch(b, &dims)?;
    let c = dims[1];
    let cd = accumulate_dtype(dtype);
    let training = b.bool_arg(5)?;
    let xc = b.convert(x, cd);
    let reduce = batch_dims(dims.len());
    let count: i64 = reduce.iter().map(|&d| dims[d as usize]).product();
    let (mean_c, invstd_c) = if training {
        let s = b.reduce(xc, ReduceOp::Sum, &reduce);
        let n = b.constant(Literal::Int(count), cd, &[c]);
        let mean = b.binary(BinaryOp::Div, s, n)?;
        let mb = per_channel(b, mean, &dims);
        let centered = b.sub(xc, mb)?;
        let sq = b.mul(centered, centered)?;
        let ss = b.reduce(sq, ReduceOp::Sum, &reduce);
        let var = b.binary(BinaryOp::Div, ss, n)?;
        let invstd = inv_std(b, var, 7)?;
        // Running statistics: (1 - momentum) * old + momentum * new, with the
        // unbiased variance.
        let unbiased_n = b.constant(Literal::Int((count - 1).max(1)), cd, &[c]);
        let var_unbiased = b.binary(BinaryOp::Div, ss, unbiased_n)?;
        for (index, stat) in [(3usize, mean), (4, var_unbiased)] {
            if let Some(t) = b.opt_tensor_arg(index)? {
                let t = t.clone();
                let old = b.read(&t)?;
                let old = b.convert(old, cd);
                let momentum = broadcast_scalar(b, 6, cd, &[c])?;
                let one = b.constant(Literal::Int(1), cd, &[c]);
                let keep = b.sub(one, momentum)?;
                let kept = b.mul(keep, old)?;
                let fresh = b.mul(momentum, stat)?;
                let updated = b.add(kept, fresh)?;
                b.write(&t, updated)?;
            }
        }
        (mean, invstd)
    } else {
        let rm = required(b, 3, cd, &[c], "running_mean in eval mode")?;
        let rv = required(b, 4, cd, &[c], "running_var in eval mode")?;
        let invstd = inv_std(b, rv, 7)?;
        (rm, invstd)
    };
    let mb = per_channel(b, mean_c, &dims);
    let ib = per_channel(b, invstd_c, &dims);
    let centered = b.sub(xc, mb)?;
    let y = b.mul(centered, ib)?;
    let y = affine(b, y, 1, c)?;
    let y = b.convert(y, dtype);
    b.output(y)?;
    if training {
        b.output(mean_c)?;
        b.output(invstd_c)
    } else {
        // ATen returns empty statistics in eval mode.
        let empty = b.constant(Literal::Int(0), cd, &[0]);
        b.output(empty)?;
        let empty = b.constant(Literal::Int(0), cd, &[0]);
        b.output(empty)
    }
}

/// Errors unless `dims` are a batch's: (N, C, ...).
fn require_batch(b: &Builder, dims: &[i64]) -> Result<()> {
    if dims.len() < 2 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "at least 2 dimensions (N, C, ...)",
            format!("{dims:?}"),
        ));
    }
    Ok(())
}

/// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
/// running_var?, save_mean?, save_invstd?, train, eps, output_mask).
fn batch_norm_backward(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 1)?;
    require_batch(b, &dims)?;
    let c = dims[1];
    let cd = accumulate_dtype(dtype);
    let train = b.bool_arg(7)?;
    let mask = output_mask(b, 9)?;
    let reduce = batch_dims(dims.len());
    let count: i64 = reduce.iter().map(|&d| dims[d as usize]).product();
    let g = b.tensor(0)?;
    let g = b.convert(g, cd);
    let xc = b.convert(x, cd);
    let (mean, invstd) = if train {
        let m = required(b, 5, cd, &[c], "save_mean in training")?;
        let i = required(b, 6, cd, &[c], "save_invstd in training")?;
        (m, i)
    } else {
        let m = required(b, 3, cd, &[c], "running_mean in eval")?;
        let v = required(b, 4, cd, &[c], "running_var in eval")?;
        (m, inv_std(b, v, 8)?)
    };
    let mb = per_channel(b, mean, &dims);
    let ib = per_channel(b, invstd, &dims);
    let centered = b.sub(xc, mb)?;
    let xhat = b.mul(centered, ib)?;
    let weight = optional(b, 2, cd, &[c])?;
    let sum_g = b.reduce(g, ReduceOp::Sum, &reduce);
    let gx = b.mul(g, xhat)?;
    let sum_gx = b.reduce(gx, ReduceOp::Sum, &reduce);
    output_if(b, mask[0], |b| {
        let scale = match weight {
            Some(w) => b.mul(w, invstd)?,
            None => invstd,
        };
        let scale = per_channel(b, scale, &dims);
        let gi = if train {
            // scale / n * (n g - sum(g) - xhat sum(g xhat))
            let n = b.constant(Literal::Int(count), cd, &dims);
            let ng = b.mul(n, g)?;
            let sg = per_channel(b, sum_g, &dims);
            let sgx = per_channel(b, sum_gx, &dims);
            let t = b.mul(xhat, sgx)?;
            let d = b.sub(ng, sg)?;
            let d = b.sub(d, t)?;
            let sd = b.mul(scale, d)?;
            b.binary(BinaryOp::Div, sd, n)?
        } else {
            b.mul(g, scale)?
        };
        Ok(b.convert(gi, dtype))
    })?;
    let weight_dtype = b.opt_tensor_arg(2)?.map(|t| t.view.dtype).unwrap_or(dtype);
    for (k, value) in [(1usize, sum_gx), (2, sum_g)] {
        output_if(b, mask[k], |b| Ok(b.convert(value, weight_dtype)))?;
    }
    Ok(())
}

/// Group-norm geometry from (N, C, HxW, group) at `first`.
fn group_geometry(b: &Builder, first: usize) -> Result<(i64, i64, i64, i64)> {
    let (n, c, hw, g) = (
        b.int_arg(first)?,
        b.int_arg(first + 1)?,
        b.int_arg(first + 2)?,
        b.int_arg(first + 3)?,
    );
    if g < 1 || c % g != 0 {
        return Err(b.arg_error(
            first + 3,
            format!("a group count dividing the {c} channels"),
            g,
        ));
    }
    Ok((n, c, hw, g))
}

/// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) ->
/// (out, mean [N, G], rstd [N, G]).
fn group_norm(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let (n, c, hw, g) = group_geometry(b, 3)?;
    let cd = accumulate_dtype(dtype);
    let x = b.convert(x, cd);
    let grouped = b.reshape(x, &[n, g, c / g * hw])?;
    let (mean, centered, rstd) = moments(b, grouped, 2, 7)?;
    let normed = b.mul(centered, rstd)?;
    let y = b.reshape(normed, &[n, c, hw])?;
    let y = affine(b, y, 1, c)?;
    let y = b.reshape(y, &dims)?;
    let y = b.convert(y, dtype);
    b.output(y)?;
    for stat in [mean, rstd] {
        let s = b.slice(stat, &[0, 0, 0], &[n, g, 1], &[1, 1, 1]);
        let s = b.reshape(s, &[n, g])?;
        let s = b.convert(s, dtype);
        b.output(s)?;
    }
    Ok(())
}

/// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
/// HxW, group, output_mask).
fn group_norm_backward(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 1)?;
    let (n, c, hw, g) = group_geometry(b, 5)?;
    let mask = output_mask(b, 9)?;
    let cd = accumulate_dtype(dtype);
    let d = c / g * hw;
    let gy = b.tensor(0)?;
    let gy = b.convert(gy, cd);
    let gy = b.reshape(gy, &[n, c, hw])?;
    let x = b.convert(x, cd);
    let xg = b.reshape(x, &[n, g, d])?;
    let (xhat, rstd) = saved_xhat(b, xg, 2, cd, &[n, g], &[0, 1])?;
    let xhat_c = b.reshape(xhat, &[n, c, hw])?;
    let weight = optional(b, 4, cd, &[c])?;
    output_if(b, mask[0], |b| {
        let gw = match weight {
            Some(w) => {
                let w = b.broadcast_in_dim(w, &[n, c, hw], &[1]);
                b.mul(gy, w)?
            }
            None => gy,
        };
        let gw = b.reshape(gw, &[n, g, d])?;
        let gi = normalized_input_grad(b, gw, xhat, rstd, 2)?;
        let gi = b.reshape(gi, &dims)?;
        Ok(b.convert(gi, dtype))
    })?;
    let param_dtype = b.opt_tensor_arg(4)?.map(|t| t.view.dtype).unwrap_or(dtype);
    for k in [1usize, 2] {
        output_if(b, mask[k], |b| {
            let term = if k == 1 { b.mul(gy, xhat_c)? } else { gy };
            let s = b.reduce(term, ReduceOp::Sum, &[0, 2]);
            Ok(b.convert(s, param_dtype))
        })?;
    }
    Ok(())
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op!("aten::native_layer_norm", layer_norm()),
        op!("aten::native_layer_norm_backward", layer_norm_backward()),
        op!("aten::native_batch_norm", batch_norm()),
        // Same arguments as native_batch_norm (running stats required).
        op!("aten::_native_batch_norm_legit", batch_norm()),
        op!("aten::native_batch_norm_backward", batch_norm_backward()),
        op!("aten::native_group_norm", group_norm()),
        op!("aten::native_group_norm_backward", group_norm_backward()),
    ]
}
