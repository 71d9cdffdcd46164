//! Resampling along the trailing (spatial) dims: nearest and bilinear
//! upsampling, reflection and replication padding, with backwards.
//!
//! Each is separable: per spatial axis, a host-computed list of source
//! indices (and weights) maps output positions to input positions, with
//! ATen's exact index arithmetic; the forward gathers, the backward
//! scatter-adds.

use super::{is_float, op, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, ValueId};

/// Per output position along one axis: (source index, weight) terms.
type AxisMap = Vec<Vec<(i64, f64)>>;

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
        let idx = b.host_tensor(
            index.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            DType::I64,
            &[n],
        );
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
    if !is_float(view.dtype) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a floating point tensor",
            view.dtype,
        ));
    }
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

fn reflect_map(input: i64, low: i64, high: i64) -> AxisMap {
    (0..input + low + high)
        .map(|o| {
            let i = o - low;
            let i = if i < 0 {
                -i
            } else if i >= input {
                2 * (input - 1) - i
            } else {
                i
            };
            vec![(i, 1.0)]
        })
        .collect()
}

fn replicate_map(input: i64, low: i64, high: i64) -> AxisMap {
    (0..input + low + high)
        .map(|o| vec![((o - low).clamp(0, input - 1), 1.0)])
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
fn spatial(b: &Builder, sizes: &[i64], k: usize) -> Result<Vec<i64>> {
    if sizes.len() < k + 1 || sizes[sizes.len() - k..].iter().any(|&s| s < 1) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            format!("a non-empty input with {k} spatial dims"),
            format!("{sizes:?}"),
        ));
    }
    Ok(sizes[sizes.len() - k..].to_vec())
}

/// upsample_nearest{1,2,3}d(self, output_size, scales...?) and
/// _upsample_nearest_exact* (half-pixel centres), with backwards (grad,
/// output_size, input_size, scales...?).
fn nearest(b: &mut Builder, k: usize, exact: bool, backward_pass: bool) -> Result<()> {
    let out = b.int_list_arg(1)?;
    let sizes = if backward_pass {
        b.int_list_arg(2)?
    } else {
        b.tensor_arg(0)?.view.sizes.clone()
    };
    let input = spatial(b, &sizes, k)?;
    if out.len() != k {
        return Err(b.arg_error(1, format!("{k} output sizes"), out.len()));
    }
    let first_scale = if backward_pass { 3 } else { 2 };
    let mut maps = Vec::with_capacity(k);
    for axis in 0..k {
        let factor = opt_float(b, first_scale + axis)?;
        maps.push(if exact {
            nearest_exact_map(input[axis], out[axis], factor)
        } else {
            nearest_map(input[axis], out[axis], factor)
        });
    }
    if backward_pass {
        backward(b, &maps, &sizes)
    } else {
        forward(b, &maps)
    }
}

/// upsample_{linear1d,bilinear2d,trilinear3d}(self, output_size,
/// align_corners, scales...?) and backwards (grad, output_size, input_size,
/// align_corners, scales...?).
fn linear(b: &mut Builder, k: usize, backward_pass: bool) -> Result<()> {
    let out = b.int_list_arg(1)?;
    let sizes = if backward_pass {
        b.int_list_arg(2)?
    } else {
        b.tensor_arg(0)?.view.sizes.clone()
    };
    let input = spatial(b, &sizes, k)?;
    if out.len() != k {
        return Err(b.arg_error(1, format!("{k} output sizes"), out.len()));
    }
    let align_index = if backward_pass { 3 } else { 2 };
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
    if backward_pass {
        backward(b, &maps, &sizes)
    } else {
        forward(b, &maps)
    }
}

/// reflection/replication_pad{1,2}d(self, padding) and their backwards
/// (grad_output, self, padding).
fn pad(b: &mut Builder, k: usize, reflect: bool, backward_pass: bool) -> Result<()> {
    let (sizes, pad_index) = if backward_pass {
        (b.tensor_arg(1)?.view.sizes.clone(), 2)
    } else {
        (b.tensor_arg(0)?.view.sizes.clone(), 1)
    };
    let padding = b.int_list_arg(pad_index)?;
    if padding.len() != 2 * k {
        return Err(b.arg_error(pad_index, format!("{} values", 2 * k), padding.len()));
    }
    let input = spatial(b, &sizes, k)?;
    let mut maps = Vec::new();
    for axis in 0..k {
        // Padding pairs run from the last dim backwards.
        let (low, high) = (padding[2 * (k - 1 - axis)], padding[2 * (k - 1 - axis) + 1]);
        if reflect && (low >= input[axis] || high >= input[axis]) {
            return Err(b.arg_error(
                pad_index,
                format!("reflection padding below the input size {}", input[axis]),
                format!("{padding:?}"),
            ));
        }
        maps.push(if reflect {
            reflect_map(input[axis], low, high)
        } else {
            replicate_map(input[axis], low, high)
        });
    }
    if backward_pass {
        backward(b, &maps, &sizes)
    } else {
        forward(b, &maps)
    }
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op("aten::upsample_nearest1d", |b| nearest(b, 1, false, false)),
        op("aten::upsample_nearest1d.out", |b| {
            nearest(b, 1, false, false)
        }),
        op("aten::upsample_nearest1d_backward", |b| {
            nearest(b, 1, false, true)
        }),
        op("aten::upsample_nearest1d_backward.grad_input", |b| {
            nearest(b, 1, false, true)
        }),
        op("aten::_upsample_nearest_exact1d", |b| {
            nearest(b, 1, true, false)
        }),
        op("aten::_upsample_nearest_exact1d.out", |b| {
            nearest(b, 1, true, false)
        }),
        op("aten::_upsample_nearest_exact1d_backward", |b| {
            nearest(b, 1, true, true)
        }),
        op("aten::_upsample_nearest_exact1d_backward.grad_input", |b| {
            nearest(b, 1, true, true)
        }),
        op("aten::upsample_nearest2d", |b| nearest(b, 2, false, false)),
        op("aten::upsample_nearest2d.out", |b| {
            nearest(b, 2, false, false)
        }),
        op("aten::upsample_nearest2d_backward", |b| {
            nearest(b, 2, false, true)
        }),
        op("aten::upsample_nearest2d_backward.grad_input", |b| {
            nearest(b, 2, false, true)
        }),
        op("aten::_upsample_nearest_exact2d", |b| {
            nearest(b, 2, true, false)
        }),
        op("aten::_upsample_nearest_exact2d.out", |b| {
            nearest(b, 2, true, false)
        }),
        op("aten::_upsample_nearest_exact2d_backward", |b| {
            nearest(b, 2, true, true)
        }),
        op("aten::_upsample_nearest_exact2d_backward.grad_input", |b| {
            nearest(b, 2, true, true)
        }),
        op("aten::upsample_nearest3d", |b| nearest(b, 3, false, false)),
        op("aten::upsample_nearest3d.out", |b| {
            nearest(b, 3, false, false)
        }),
        op("aten::upsample_nearest3d_backward", |b| {
            nearest(b, 3, false, true)
        }),
        op("aten::upsample_nearest3d_backward.grad_input", |b| {
            nearest(b, 3, false, true)
        }),
        op("aten::_upsample_nearest_exact3d", |b| {
            nearest(b, 3, true, false)
        }),
        op("aten::_upsample_nearest_exact3d.out", |b| {
            nearest(b, 3, true, false)
        }),
        op("aten::_upsample_nearest_exact3d_backward", |b| {
            nearest(b, 3, true, true)
        }),
        op("aten::_upsample_nearest_exact3d_backward.grad_input", |b| {
            nearest(b, 3, true, true)
        }),
        op("aten::upsample_linear1d", |b| linear(b, 1, false)),
        op("aten::upsample_linear1d.out", |b| linear(b, 1, false)),
        op("aten::upsample_linear1d_backward", |b| linear(b, 1, true)),
        op("aten::upsample_linear1d_backward.grad_input", |b| {
            linear(b, 1, true)
        }),
        op("aten::upsample_bilinear2d", |b| linear(b, 2, false)),
        op("aten::upsample_bilinear2d.out", |b| linear(b, 2, false)),
        op("aten::upsample_bilinear2d_backward", |b| linear(b, 2, true)),
        op("aten::upsample_bilinear2d_backward.grad_input", |b| {
            linear(b, 2, true)
        }),
        op("aten::upsample_trilinear3d", |b| linear(b, 3, false)),
        op("aten::upsample_trilinear3d.out", |b| linear(b, 3, false)),
        op("aten::upsample_trilinear3d_backward", |b| {
            linear(b, 3, true)
        }),
        op("aten::upsample_trilinear3d_backward.grad_input", |b| {
            linear(b, 3, true)
        }),
        op("aten::reflection_pad1d", |b| pad(b, 1, true, false)),
        op("aten::reflection_pad1d.out", |b| pad(b, 1, true, false)),
        op("aten::reflection_pad1d_backward", |b| pad(b, 1, true, true)),
        op("aten::reflection_pad1d_backward.grad_input", |b| {
            pad(b, 1, true, true)
        }),
        op("aten::reflection_pad2d", |b| pad(b, 2, true, false)),
        op("aten::reflection_pad2d.out", |b| pad(b, 2, true, false)),
        op("aten::reflection_pad2d_backward", |b| pad(b, 2, true, true)),
        op("aten::reflection_pad2d_backward.grad_input", |b| {
            pad(b, 2, true, true)
        }),
        op("aten::replication_pad1d", |b| pad(b, 1, false, false)),
        op("aten::replication_pad1d.out", |b| pad(b, 1, false, false)),
        op("aten::replication_pad1d_backward", |b| {
            pad(b, 1, false, true)
        }),
        op("aten::replication_pad1d_backward.grad_input", |b| {
            pad(b, 1, false, true)
        }),
        op("aten::replication_pad2d", |b| pad(b, 2, false, false)),
        op("aten::replication_pad2d.out", |b| pad(b, 2, false, false)),
        op("aten::replication_pad2d_backward", |b| {
            pad(b, 2, false, true)
        }),
        op("aten::replication_pad2d_backward.grad_input", |b| {
            pad(b, 2, false, true)
        }),
    ]
}
