//! Convolution (1-3 spatial dims, stride, padding, dilation, groups,
//! transposed) and its backward, as StableHLO convolutions; the backward
//! follows the standard transposition rules (as JAX derives them).

use super::{accumulate_dtype, is_float, output_if, real_only, OpDef};
use crate::builder::{Arg, Builder};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, ReduceOp, ValueId};

/// The layout strings of an N-d convolution with `sp` spatial dims, from
/// the input's, kernel's and output's leading letters.
fn layouts(sp: usize, prefixes: [&str; 3]) -> [String; 3] {
    let digits: String = (0..sp).map(|d| char::from(b'0' + d as u8)).collect();
    prefixes.map(|prefix| format!("{prefix}{digits}"))
}

/// Geometry shared by forward and backward: per spatial dim.
struct Geometry {
    sp: usize,
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    output_padding: Vec<i64>,
    groups: i64,
    transposed: bool,
}

/// Reads an int list argument expanded to `sp` entries (a single value
/// repeats, as PyTorch's `_pair` does).
fn per_dim(b: &Builder, index: usize, sp: usize, default: i64) -> Result<Vec<i64>> {
    let v = match b.arg(index)? {
        Arg::None => vec![default],
        _ => b.int_list_arg(index)?,
    };
    match v.len() {
        0 => Ok(vec![default; sp]),
        1 => Ok(vec![v[0]; sp]),
        n if n == sp => Ok(v),
        n => Err(b.arg_error(index, format!("{sp} values (one per spatial dim)"), n)),
    }
}

/// Argument positions of stride, padding, dilation, transposed,
/// output_padding and groups.
fn geometry(b: &Builder, input_rank: usize, first: usize) -> Result<Geometry> {
    if !(3..=5).contains(&input_rank) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a 3-D, 4-D or 5-D (batched) input",
            format!("{input_rank}-D"),
        ));
    }
    let sp = input_rank - 2;
    let g = Geometry {
        sp,
        stride: per_dim(b, first, sp, 1)?,
        padding: per_dim(b, first + 1, sp, 0)?,
        dilation: per_dim(b, first + 2, sp, 1)?,
        transposed: b.bool_arg(first + 3)?,
        output_padding: per_dim(b, first + 4, sp, 0)?,
        groups: b.int_arg(first + 5)?,
    };
    if g.groups < 1
        || g.stride.iter().any(|&s| s < 1)
        || g.dilation.iter().any(|&d| d < 1)
        || g.padding.iter().any(|&p| p < 0)
    {
        return Err(Error::invalid(
            format!("{}: geometry", b.op_name()),
            "groups >= 1, stride >= 1, dilation >= 1, padding >= 0",
            format!(
                "groups {} stride {:?} dilation {:?} padding {:?}",
                g.groups, g.stride, g.dilation, g.padding
            ),
        ));
    }
    Ok(g)
}

/// A standard convolution: x [N, C, *], w [O, C/g, *k].
fn conv_forward(b: &mut Builder, x: ValueId, w: ValueId, g: &Geometry) -> Result<ValueId> {
    let (xd, wd) = (b.dims(x), b.dims(w));
    if xd[1] != wd[1] * g.groups || wd[0] % g.groups != 0 {
        return Err(Error::invalid(
            format!("{}: weight", b.op_name()),
            format!(
                "[O, {}/{}, ...] with O divisible by groups for input {:?}",
                xd[1], g.groups, xd
            ),
            format!("{wd:?}"),
        ));
    }
    let mut out = vec![xd[0], wd[0]];
    for i in 0..g.sp {
        let eff = g.dilation[i] * (wd[2 + i] - 1) + 1;
        let size = (xd[2 + i] + 2 * g.padding[i] - eff) / g.stride[i] + 1;
        if size < 1 {
            return Err(Error::invalid(
                format!("{}: input size", b.op_name()),
                "an input at least as large as the dilated kernel",
                format!("{xd:?} with kernel {wd:?}"),
            ));
        }
        out.push(size);
    }
    let pads: Vec<(i64, i64)> = g.padding.iter().map(|&p| (p, p)).collect();
    Ok(grouped_conv(
        b,
        x,
        w,
        g,
        (&g.stride, &vec![1; g.sp]),
        &pads,
        &out,
    ))
}

/// A grouped convolution of x [N, C, *] with w [O, C/g, *k]: window
/// strides and input (lhs) dilation as given, the kernel dilated by
/// `g.dilation`.
fn grouped_conv(
    b: &mut Builder,
    x: ValueId,
    w: ValueId,
    g: &Geometry,
    (strides, lhs_dilation): (&[i64], &[i64]),
    pads: &[(i64, i64)],
    out: &[i64],
) -> ValueId {
    let layouts = layouts(g.sp, ["bf", "oi", "bf"]);
    b.convolution(
        x,
        w,
        layouts.each_ref().map(String::as_str),
        strides,
        pads,
        lhs_dilation,
        &g.dilation,
        (g.groups, 1),
        out,
    )
}

/// A transposed convolution: x [N, Cin, *], w [Cin, Cout/g, *k]; output
/// spatial sizes `(in - 1) s - 2p + d (k - 1) + output_padding + 1`.
fn conv_transposed(
    b: &mut Builder,
    x: ValueId,
    w: ValueId,
    g: &Geometry,
    output_padding: &[i64],
) -> Result<ValueId> {
    let (xd, wd) = (b.dims(x), b.dims(w));
    let cin = wd[0];
    if xd[1] != cin || cin % g.groups != 0 {
        return Err(Error::invalid(
            format!("{}: weight", b.op_name()),
            format!("[{}, Cout/groups, ...] for input {:?}", xd[1], xd),
            format!("{wd:?}"),
        ));
    }
    let cout = wd[1] * g.groups;
    let k: Vec<i64> = wd[2..].to_vec();
    // [Cin, Cout/g, k] → [g, Cin/g, Cout/g, k] → [g, Cout/g, Cin/g, k] → [Cout, Cin/g, k], flipped.
    let mut split = vec![g.groups, cin / g.groups, wd[1]];
    split.extend(&k);
    let w = b.reshape(w, &split)?;
    let mut perm = vec![0, 2, 1];
    perm.extend((3..3 + g.sp as i64).collect::<Vec<_>>());
    let w = b.transpose(w, &perm);
    let mut merged = vec![cout, cin / g.groups];
    merged.extend(&k);
    let w = b.reshape(w, &merged)?;
    let spatial: Vec<i64> = (2..2 + g.sp as i64).collect();
    let w = b.reverse(w, &spatial);
    let mut out = vec![xd[0], cout];
    let mut pads = Vec::new();
    for i in 0..g.sp {
        let dk = g.dilation[i] * (k[i] - 1);
        pads.push((dk - g.padding[i], dk - g.padding[i] + output_padding[i]));
        out.push((xd[2 + i] - 1) * g.stride[i] - 2 * g.padding[i] + dk + output_padding[i] + 1);
    }
    Ok(grouped_conv(
        b,
        x,
        w,
        g,
        (&vec![1; g.sp], &g.stride),
        &pads,
        &out,
    ))
}

/// The weight gradient of a standard convolution with input `x` and output
/// gradient `gy`, for a kernel of spatial size `k`: [O, C/g, *k].
fn conv_weight_grad(
    b: &mut Builder,
    x: ValueId,
    gy: ValueId,
    k: &[i64],
    g: &Geometry,
) -> Result<ValueId> {
    let (xd, gd) = (b.dims(x), b.dims(gy));
    let mut out = vec![gd[1], xd[1] / g.groups];
    out.extend(k);
    let mut pads = Vec::new();
    for i in 0..g.sp {
        let dk = g.dilation[i] * (k[i] - 1) + 1;
        let od = g.stride[i] * (gd[2 + i] - 1) + 1;
        let lo = g.padding[i];
        pads.push((lo, od - xd[2 + i] + dk - lo - 1));
    }
    Ok(b.convolution(
        x,
        gy,
        layouts(g.sp, ["fb", "io", "fb"])
            .each_ref()
            .map(String::as_str),
        &g.dilation,
        &pads,
        &vec![1; g.sp],
        &g.stride,
        (1, g.groups),
        &out,
    ))
}

fn check_float(b: &Builder, index: usize) -> Result<()> {
    let dtype = b.tensor_arg(index)?.view.dtype;
    real_only(b, dtype)?;
    if !is_float(dtype) {
        return Err(b.arg_error(index, "a floating point tensor", dtype));
    }
    Ok(())
}

/// convolution(input, weight, bias?, stride, padding, dilation, transposed,
/// output_padding, groups).
fn convolution(b: &mut Builder) -> Result<()> {
    check_float(b, 0)?;
    let rank = b.tensor_arg(0)?.view.sizes.len();
    let g = geometry(b, rank, 3)?;
    let (input_dtype, weight_dtype) = (b.tensor_arg(0)?.view.dtype, b.tensor_arg(1)?.view.dtype);
    if input_dtype != weight_dtype {
        return Err(Error::invalid(
            format!("{}: weight", b.op_name()),
            format!("dtype {input_dtype} (the input's)"),
            weight_dtype,
        ));
    }
    let x = b.tensor(0)?;
    let w = b.tensor(1)?;
    let y = if g.transposed {
        conv_transposed(b, x, w, &g, &g.output_padding.clone())?
    } else {
        conv_forward(b, x, w, &g)?
    };
    let mut y = b.convert(y, input_dtype);
    if b.opt_tensor_arg(2)?.is_some() {
        let bias = b.tensor(2)?;
        let bias = b.convert(bias, input_dtype);
        let dims = b.dims(y);
        let bias = b.broadcast_in_dim(bias, &dims, &[1]);
        y = b.binary(BinaryOp::Add, y, bias)?;
    }
    b.output(y)
}

/// convolution_backward(grad_output, input, weight, bias_sizes?, stride,
/// padding, dilation, transposed, output_padding, groups, output_mask), or
/// the `_overrideable` form without bias_sizes (`first` = 3).
fn convolution_backward(b: &mut Builder, first: usize) -> Result<()> {
    check_float(b, 1)?;
    let rank = b.tensor_arg(1)?.view.sizes.len();
    let g = geometry(b, rank, first)?;
    let mask = match b.arg(first + 6) {
        Ok(Arg::IntList(v)) if v.len() == 3 => [v[0] != 0, v[1] != 0, v[2] != 0],
        _ => [true; 3],
    };
    let input_sizes = b.tensor_arg(1)?.view.sizes.clone();
    let dtype = b.tensor_arg(1)?.view.dtype;
    let weight_sizes = b.tensor_arg(2)?.view.sizes.clone();
    let gy = b.tensor(0)?;
    let x = b.tensor(1)?;
    let w = b.tensor(2)?;
    let gd = b.dims(gy);
    output_if(b, mask[0], |b| {
        let gx = if g.transposed {
            // The input gradient of a transposed convolution is a standard one.
            conv_forward(b, gy, w, &g)?
        } else {
            // A transposed convolution, with the output padding that restores
            // the input's size.
            let op: Vec<i64> = (0..g.sp)
                .map(|i| {
                    let dk = g.dilation[i] * (weight_sizes[2 + i] - 1);
                    input_sizes[2 + i] - ((gd[2 + i] - 1) * g.stride[i] - 2 * g.padding[i] + dk + 1)
                })
                .collect();
            conv_transposed(b, gy, w, &g, &op)?
        };
        Ok(b.convert(gx, dtype))
    })?;
    output_if(b, mask[1], |b| {
        let k = &weight_sizes[2..];
        let gw = if g.transposed {
            conv_weight_grad(b, gy, x, k, &g)?
        } else {
            conv_weight_grad(b, x, gy, k, &g)?
        };
        let gw = b.reshape(gw, &weight_sizes)?;
        Ok(b.convert(gw, dtype))
    })?;
    output_if(b, mask[2], |b| {
        let dims: Vec<i64> = (0..gd.len() as i64).filter(|&d| d != 1).collect();
        let acc = accumulate_dtype(dtype);
        let gy = b.convert(gy, acc);
        let gb = b.reduce(gy, ReduceOp::Sum, &dims);
        Ok(b.convert(gb, dtype))
    })
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op!("aten::convolution", convolution()),
        op!("aten::convolution_overrideable", convolution()),
        op!("aten::convolution_backward", convolution_backward(4)),
        op!(
            "aten::convolution_backward_overrideable",
            convolution_backward(3)
        ),
    ]
}
