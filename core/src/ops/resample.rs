//! Resampling along the trailing (spatial) dims: nearest and bilinear
//! upsampling, with backwards; padding builds on the same maps.
//!
//! Each is separable: per spatial axis, a host-computed list of source
//! indices (and weights) maps output positions to input positions, with
//! ATen's exact index arithmetic; the forward gathers, the backward
//! scatter-adds.

use super::index::bytes_of;
use super::{require_float, OpDef, Pass};
use crate::builder::{Arg, Builder};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, ValueId};

/// Per output position along one axis: (source index, weight) terms.
pub(super) type AxisMap = Vec<Vec<(i64, f64)>>;

/// The flat input index of every output element for one combination of
/// per-axis terms, as an s64 tensor [planes, out...], and the matching
/// weights as `dtype`.
fn combination(
    b: &mut Builder,
    planes: i64,
    input: &[i64],
    maps: &[AxisMap],
    choice: &[usize],
    dtype: DType,
) -> Result<(ValueId, ValueId)> {
    let out: Vec<i64> = maps.iter().map(|m| m.len() as i64).collect();
    let mut shape = vec![planes];
    shape.extend(&out);
    let plane_size: i64 = input.iter().product();
    let plane = b.iota(DType::I64, &shape, 0);
    let ps = b.constant(Literal::Int(plane_size), DType::I64, &shape);
    let mut flat = b.binary(BinaryOp::Mul, plane, ps)?;
    let mut weight = b.constant(Literal::Float(1.0), dtype, &shape);
    let mut stride = plane_size;
    for (axis, map) in maps.iter().enumerate() {
        stride /= input[axis];
        let index: Vec<i64> = map
            .iter()
            .map(|terms| terms.get(choice[axis]).map_or(0, |t| t.0) * stride)
            .collect();
        let w: Vec<f64> = map
            .iter()
            .map(|terms| terms.get(choice[axis]).map_or(0.0, |t| t.1))
            .collect();
        let n = map.len() as i64;
        let idx = b.host_tensor(bytes_of(&index), DType::I64, &[n]);
        let idx = b.broadcast_in_dim(idx, &shape, &[axis as i64 + 1]);
        flat = b.binary(BinaryOp::Add, flat, idx)?;
        let wv = b.host_tensor(
            w.iter().flat_map(|v| (*v as f32).to_ne_bytes()).collect(),
            DType::F32,
            &[n],
        );
        let wv = b.convert(wv, dtype);
        let wv = b.broadcast_in_dim(wv, &shape, &[axis as i64 + 1]);
        weight = b.binary(BinaryOp::Mul, weight, wv)?;
    }
    Ok((flat, weight))
}

/// Every choice of one term per axis (2 per axis for bilinear, 1 otherwise).
fn choices(maps: &[AxisMap]) -> Vec<Vec<usize>> {
    let counts: Vec<usize> = maps
        .iter()
        .map(|m| m.iter().map(Vec::len).max().unwrap_or(1))
        .collect();
    let mut all = vec![vec![]];
    for &c in &counts {
        all = all
            .into_iter()
            .flat_map(|prefix| (0..c).map(move |i| [prefix.clone(), vec![i]].concat()))
            .collect();
    }
    all
}

/// out[p, o...] = Σ_terms w x[p, i...] for a float input of `sizes`
/// (argument 0), resampled along its trailing `maps.len()` dims.
fn forward(b: &mut Builder, maps: &[AxisMap]) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    require_float(b, "input", view.dtype)?;
    let k = maps.len();
    let r = view.sizes.len();
    let input = view.sizes[r - k..].to_vec();
    let planes: i64 = view.sizes[..r - k].iter().product();
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[view.numel() as i64])?;
    let mut acc: Option<ValueId> = None;
    for choice in choices(maps) {
        let (flat, weight) = combination(b, planes, &input, maps, &choice, view.dtype)?;
        let g = b.flat_gather(x, flat);
        let term = b.binary(BinaryOp::Mul, g, weight)?;
        acc = Some(match acc {
            Some(a) => b.binary(BinaryOp::Add, a, term)?,
            None => term,
        });
    }
    let out =
        acc.ok_or_else(|| Error::invalid(format!("{}: axes", b.op_name()), "at least one", 0))?;
    let mut sizes = view.sizes[..r - k].to_vec();
    sizes.extend(maps.iter().map(|m| m.len() as i64));
    let out = b.reshape(out, &sizes)?;
    b.output(out)
}

/// The adjoint: scatter-add `grad` (argument 0) back to an input of
/// `input_sizes`.
fn backward(b: &mut Builder, maps: &[AxisMap], input_sizes: &[i64]) -> Result<()> {
    let g = b.tensor(0)?;
    let dtype = b.dtype(g);
    let k = maps.len();
    let r = input_sizes.len();
    let input = input_sizes[r - k..].to_vec();
    let planes: i64 = input_sizes[..r - k].iter().product();
    let mut shape = vec![planes];
    shape.extend(maps.iter().map(|m| m.len() as i64));
    let g = b.reshape(g, &shape)?;
    let total: i64 = input_sizes.iter().product();
    let mut acc = b.constant(Literal::Int(0), dtype, &[total]);
    for choice in choices(maps) {
        let (flat, weight) = combination(b, planes, &input, maps, &choice, dtype)?;
        let share = b.binary(BinaryOp::Mul, g, weight)?;
        acc = b.flat_scatter_add(acc, flat, share);
    }
    let out = b.reshape(acc, input_sizes)?;
    b.output(out)
}

/// ATen's scale: 1 / scale_factor when given, else input / output.
fn scale(input: i64, output: i64, factor: Option<f64>, align_corners: Option<bool>) -> f64 {
    if align_corners == Some(true) {
        return if output > 1 {
            (input - 1) as f64 / (output - 1) as f64
        } else {
            0.0
        };
    }
    match factor {
        Some(f) if f > 0.0 => 1.0 / f,
        _ => input as f64 / output as f64,
    }
}

fn nearest_map(input: i64, output: i64, factor: Option<f64>) -> AxisMap {
    let s = scale(input, output, factor, None) as f32;
    (0..output)
        .map(|o| {
            let i = if output == input {
                o
            } else if output == 2 * input {
                o >> 1
            } else {
                ((o as f32 * s).floor() as i64).min(input - 1)
            };
            vec![(i, 1.0)]
        })
        .collect()
}

/// nearest-exact: the source pixel whose centre is nearest, floor((o + 0.5) s).
fn nearest_exact_map(input: i64, output: i64, factor: Option<f64>) -> AxisMap {
    let s = scale(input, output, factor, None) as f32;
    (0..output)
        .map(|o| vec![((((o as f32 + 0.5) * s).floor() as i64).min(input - 1), 1.0)])
        .collect()
}

fn linear_map(input: i64, output: i64, factor: Option<f64>, align_corners: bool) -> AxisMap {
    let s = scale(input, output, factor, Some(align_corners)) as f32;
    (0..output)
        .map(|o| {
            let src = if align_corners {
                o as f32 * s
            } else {
                ((o as f32 + 0.5) * s - 0.5).max(0.0)
            };
            let i0 = (src.floor() as i64).min(input - 1);
            let i1 = (i0 + 1).min(input - 1);
            let l1 = (src - i0 as f32) as f64;
            vec![(i0, 1.0 - l1), (i1, l1)]
        })
        .collect()
}

fn opt_float(b: &Builder, index: usize) -> Result<Option<f64>> {
    match b.arg(index) {
        Err(_) | Ok(Arg::None) => Ok(None),
        Ok(_) => b.float_arg(index).map(Some),
    }
}

/// The spatial input sizes of a resampling forward (argument 0) or
/// backward (`input_size` argument), checked against `k` spatial dims.
pub(super) fn spatial(b: &Builder, sizes: &[i64], k: usize) -> Result<Vec<i64>> {
    if sizes.len() < k + 1 || sizes[sizes.len() - k..].iter().any(|&s| s < 1) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            format!("a non-empty input with {k} spatial dims"),
            format!("{sizes:?}"),
        ));
    }
    Ok(sizes[sizes.len() - k..].to_vec())
}

/// The output sizes (argument 1), the input sizes (argument 0's, or the
/// backward's `input_size` argument 2) and its `k` spatial sizes.
fn upsample_sizes(b: &Builder, k: usize, pass: Pass) -> Result<(Vec<i64>, Dims, Vec<i64>)> {
    let out = b.int_list_arg(1)?;
    let sizes = match pass {
        Pass::Forward => b.tensor_arg(0)?.view.sizes.clone(),
        Pass::Backward => b.int_list_arg(2)?.into(),
    };
    let input = spatial(b, &sizes, k)?;
    if out.len() != k {
        return Err(b.arg_error(1, format!("{k} output sizes"), out.len()));
    }
    Ok((out, sizes, input))
}

/// Resamples by `maps`: gathers forward, scatter-adds the gradient back
/// to an input of `sizes` backward.
pub(super) fn resample(b: &mut Builder, maps: &[AxisMap], sizes: &[i64], pass: Pass) -> Result<()> {
    match pass {
        Pass::Forward => forward(b, maps),
        Pass::Backward => backward(b, maps, sizes),
    }
}

/// upsample_nearest{1,2,3}d(self, output_size, scales...?) and
/// _upsample_nearest_exact* (half-pixel centres), with backwards (grad,
/// output_size, input_size, scales...?).
fn nearest(b: &mut Builder, k: usize, exact: bool, pass: Pass) -> Result<()> {
    let (out, sizes, input) = upsample_sizes(b, k, pass)?;
    let first_scale = if pass == Pass::Backward { 3 } else { 2 };
    let mut maps = Vec::with_capacity(k);
    for axis in 0..k {
        let factor = opt_float(b, first_scale + axis)?;
        maps.push(if exact {
            nearest_exact_map(input[axis], out[axis], factor)
        } else {
            nearest_map(input[axis], out[axis], factor)
        });
    }
    resample(b, &maps, &sizes, pass)
}

/// upsample_{linear1d,bilinear2d,trilinear3d}(self, output_size,
/// align_corners, scales...?) and backwards (grad, output_size, input_size,
/// align_corners, scales...?).
fn linear(b: &mut Builder, k: usize, pass: Pass) -> Result<()> {
    let (out, sizes, input) = upsample_sizes(b, k, pass)?;
    let align_index = if pass == Pass::Backward { 3 } else { 2 };
    let align = b.bool_arg(align_index)?;
    let mut maps = Vec::with_capacity(k);
    for axis in 0..k {
        maps.push(linear_map(
            input[axis],
            out[axis],
            opt_float(b, align_index + 1 + axis)?,
            align,
        ));
    }
    resample(b, &maps, &sizes, pass)
}

pub(super) fn ops() -> Vec<OpDef> {
    [
        with_backward!("aten::upsample_nearest1d", nearest(1, false)),
        with_backward!("aten::upsample_nearest2d", nearest(2, false)),
        with_backward!("aten::upsample_nearest3d", nearest(3, false)),
        with_backward!("aten::_upsample_nearest_exact1d", nearest(1, true)),
        with_backward!("aten::_upsample_nearest_exact2d", nearest(2, true)),
        with_backward!("aten::_upsample_nearest_exact3d", nearest(3, true)),
        with_backward!("aten::upsample_linear1d", linear(1)),
        with_backward!("aten::upsample_bilinear2d", linear(2)),
        with_backward!("aten::upsample_trilinear3d", linear(3)),
    ]
    .into_iter()
    .flatten()
    .collect()
}
