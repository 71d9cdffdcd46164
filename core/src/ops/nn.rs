//! Neural-network ops: softmax and log-softmax (and backwards), NLL and MSE
//! losses (and backwards).

use super::{is_float, op, wrap_dim, OpDef};
use crate::builder::Builder;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

/// Reduces `dim` of `x` with `op` and broadcasts the result back to x's shape.
fn reduce_keep(b: &mut Builder, x: ValueId, op: ReduceOp, dim: usize) -> ValueId {
    let dims = b.dims(x);
    let r = b.reduce(x, op, &[dim as i64]);
    let keep: Vec<i64> = (0..dims.len() as i64)
        .filter(|&k| k != dim as i64)
        .collect();
    b.broadcast_in_dim(r, &dims, &keep)
}

/// The softmax input as a float value and its (wrapped) dim; a 0-d input
/// is treated as 1-element.
fn softmax_input(b: &mut Builder) -> Result<(ValueId, usize, Vec<i64>)> {
    let view = b.tensor_arg(0)?.view.clone();
    if !is_float(view.dtype) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a floating point tensor",
            view.dtype,
        ));
    }
    let dim = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let x = b.tensor(0)?;
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let x = b.reshape(x, &work)?;
    Ok((x, dim, view.sizes))
}

fn softmax(b: &mut Builder, log: bool) -> Result<()> {
    let input_dtype = b.tensor_arg(0)?.view.dtype;
    let out_dtype = if b.bool_arg(2)? {
        DType::F32
    } else {
        input_dtype
    };
    let (x, dim, sizes) = softmax_input(b)?;
    // 16-bit inputs compute in float32, as ATen's CPU kernels do.
    let x = b.convert(x, super::reduce::accumulate_dtype(input_dtype));
    let m = reduce_keep(b, x, ReduceOp::Max, dim);
    let shifted = b.binary(BinaryOp::Sub, x, m)?;
    let e = b.unary(UnaryOp::Exp, shifted);
    let s = reduce_keep(b, e, ReduceOp::Sum, dim);
    let out = if log {
        let ls = b.unary(UnaryOp::Log, s);
        b.binary(BinaryOp::Sub, shifted, ls)?
    } else {
        b.binary(BinaryOp::Div, e, s)?
    };
    let out = b.convert(out, out_dtype);
    let out = b.reshape(out, &sizes)?;
    b.output(out)
}

/// Backward of softmax (`log` false) or log-softmax from the forward output.
fn softmax_backward(b: &mut Builder, log: bool) -> Result<()> {
    let view = b.tensor_arg(1)?.view.clone();
    let dim = wrap_dim(b, b.int_arg(2)?, view.sizes.len())?;
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let g = b.tensor(0)?;
    let g = b.convert(g, view.dtype);
    let g = b.reshape(g, &work)?;
    let y = b.tensor(1)?;
    let y = b.reshape(y, &work)?;
    let out = if log {
        let s = reduce_keep(b, g, ReduceOp::Sum, dim);
        let e = b.unary(UnaryOp::Exp, y);
        let es = b.binary(BinaryOp::Mul, e, s)?;
        b.binary(BinaryOp::Sub, g, es)?
    } else {
        let gy = b.binary(BinaryOp::Mul, g, y)?;
        let s = reduce_keep(b, gy, ReduceOp::Sum, dim);
        let d = b.binary(BinaryOp::Sub, g, s)?;
        b.binary(BinaryOp::Mul, y, d)?
    };
    let input_dtype = b.opt_dtype_arg(3)?.unwrap_or(view.dtype);
    let out = b.convert(out, input_dtype);
    let out = b.reshape(out, &view.sizes)?;
    b.output(out)
}

/// The NLL pieces shared by forward and backward: input as [N, C], the
/// one-hot of the targets, and each sample's weight (0 where ignored).
struct NllParts {
    x: ValueId,
    one_hot: ValueId,
    sample_weight: ValueId,
    batched: bool,
    reduction: i64,
}

fn nll_parts(
    b: &mut Builder,
    input: usize,
    target: usize,
    weight: usize,
    reduction: usize,
    ignore: usize,
) -> Result<NllParts> {
    let view = b.tensor_arg(input)?.view.clone();
    let target_view = b.tensor_arg(target)?.view.clone();
    let batched = match view.sizes.len() {
        2 => true,
        1 => false,
        r => {
            return Err(Error::invalid(
                format!("{}: input", b.op_name()),
                "a 1-D or 2-D tensor",
                format!("{r}-D"),
            ))
        }
    };
    let (n, c) = if batched {
        (view.sizes[0], view.sizes[1])
    } else {
        (1, view.sizes[0])
    };
    let expected_target: Vec<i64> = if batched { vec![n] } else { vec![] };
    if target_view.sizes != expected_target {
        return Err(Error::invalid(
            format!("{}: target", b.op_name()),
            format!("sizes {expected_target:?} for input {:?}", view.sizes),
            format!("{:?}", target_view.sizes),
        ));
    }
    let ignore_index = b.int_arg(ignore)?;
    check_targets(b, target, c, ignore_index)?;
    let reduction = b.int_arg(reduction)?;
    let dtype = view.dtype;
    let x = b.tensor(input)?;
    let x = b.reshape(x, &[n, c])?;
    let t = b.tensor(target)?;
    let t = b.convert(t, DType::I64);
    let t = b.reshape(t, &[n])?;
    let t2 = b.broadcast_in_dim(t, &[n, c], &[0]);
    let classes = b.iota(DType::I64, &[n, c], 1);
    let one_hot = b.compare(CompareDir::Eq, t2, classes)?;
    let zeros = b.constant(Literal::Int(0), dtype, &[n, c]);
    let mut sample_weight = match b.opt_tensor_arg(weight)? {
        Some(_) => {
            let w = b.tensor(weight)?;
            let w = b.convert(w, dtype);
            let w = b.broadcast_in_dim(w, &[n, c], &[1]);
            let picked = b.select(one_hot, w, zeros)?;
            b.reduce(picked, ReduceOp::Sum, &[1])
        }
        None => b.constant(Literal::Int(1), dtype, &[n]),
    };
    let ignore_value = b.constant(Literal::Int(ignore_index), DType::I64, &[n]);
    let kept = b.compare(CompareDir::Ne, t, ignore_value)?;
    let zero_n = b.constant(Literal::Int(0), dtype, &[n]);
    sample_weight = b.select(kept, sample_weight, zero_n)?;
    Ok(NllParts {
        x,
        one_hot,
        sample_weight,
        batched,
        reduction,
    })
}

/// Reads the targets back to check their range: a bad class index must be a
/// clear error (as on CPU), not a silent zero.
fn check_targets(b: &mut Builder, target: usize, classes: i64, ignore_index: i64) -> Result<()> {
    let t = b.tensor_arg(target)?;
    if t.view.dtype == DType::Bool || is_float(t.view.dtype) {
        return Err(Error::invalid(
            format!("{}: target", b.op_name()),
            "an integer tensor",
            t.view.dtype,
        ));
    }
    let what = format!("{}: target", b.op_name());
    b.check_range(t, (0, classes), Some(ignore_index), |bad| {
        Error::invalid(
            what.clone(),
            format!("class indices in [0, {classes})"),
            format!("Target {bad} is out of bounds"),
        )
    })
}

fn nll_loss_forward(b: &mut Builder) -> Result<()> {
    let p = nll_parts(b, 0, 1, 2, 3, 4)?;
    let dtype = b.dtype(p.x);
    let dims = b.dims(p.x);
    let zeros = b.constant(Literal::Int(0), dtype, &dims);
    let picked = b.select(p.one_hot, p.x, zeros)?;
    let x_t = b.reduce(picked, ReduceOp::Sum, &[1]);
    let weighted = b.binary(BinaryOp::Mul, x_t, p.sample_weight)?;
    let losses = b.unary(UnaryOp::Neg, weighted);
    let total_weight = b.reduce(p.sample_weight, ReduceOp::Sum, &[0]);
    let out = match p.reduction {
        0 => {
            if p.batched {
                losses
            } else {
                b.reshape(losses, &[])?
            }
        }
        1 => {
            let s = b.reduce(losses, ReduceOp::Sum, &[0]);
            b.binary(BinaryOp::Div, s, total_weight)?
        }
        2 => b.reduce(losses, ReduceOp::Sum, &[0]),
        r => {
            return Err(Error::invalid(
                format!("{}: reduction", b.op_name()),
                "0 (none), 1 (mean) or 2 (sum)",
                r,
            ))
        }
    };
    b.output(out)?;
    b.output(total_weight)
}

fn nll_loss_backward(b: &mut Builder) -> Result<()> {
    // (grad_output, self, target, weight, reduction, ignore_index, total_weight)
    let input_sizes = b.tensor_arg(1)?.view.sizes.clone();
    let p = nll_parts(b, 1, 2, 3, 4, 5)?;
    let dtype = b.dtype(p.x);
    let dims = b.dims(p.x);
    let n = dims[0];
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let per_sample = match p.reduction {
        0 if p.batched => g,
        0 => b.reshape(g, &[1])?,
        1 => {
            let tw = b.tensor(6)?;
            let tw = b.convert(tw, dtype);
            let g = b.reshape(g, &[])?;
            let scaled = b.binary(BinaryOp::Div, g, tw)?;
            b.broadcast_to(scaled, &[n])?
        }
        _ => {
            let g = b.reshape(g, &[])?;
            b.broadcast_to(g, &[n])?
        }
    };
    let w = b.binary(BinaryOp::Mul, per_sample, p.sample_weight)?;
    let w = b.unary(UnaryOp::Neg, w);
    let w = b.broadcast_in_dim(w, &dims, &[0]);
    let zeros = b.constant(Literal::Int(0), dtype, &dims);
    let grad = b.select(p.one_hot, w, zeros)?;
    let grad = b.reshape(grad, &input_sizes)?;
    b.output(grad)
}

fn mse_parts(b: &mut Builder, input: usize, target: usize) -> Result<(ValueId, i64)> {
    let dtype = super::result_type(b, &[input, target])?;
    let x = super::operand(b, input, dtype)?;
    let t = super::operand(b, target, dtype)?;
    let [x, t] = super::broadcast_all(b, &[x, t])?[..] else {
        unreachable!("two values in, two out")
    };
    let d = b.binary(BinaryOp::Sub, x, t)?;
    let n = b.ty(d).numel();
    Ok((d, n))
}

fn reduce_loss(b: &mut Builder, losses: ValueId, reduction: i64, n: i64) -> Result<ValueId> {
    let rank = b.dims(losses).len() as i64;
    let all: Vec<i64> = (0..rank).collect();
    match reduction {
        0 => Ok(losses),
        1 => {
            let s = b.reduce(losses, ReduceOp::Sum, &all);
            let count = b.constant(Literal::Int(n), b.dtype(s), &[]);
            b.binary(BinaryOp::Div, s, count)
        }
        2 => Ok(b.reduce(losses, ReduceOp::Sum, &all)),
        r => Err(Error::invalid(
            format!("{}: reduction", b.op_name()),
            "0 (none), 1 (mean) or 2 (sum)",
            r,
        )),
    }
}

fn mse_loss(b: &mut Builder) -> Result<()> {
    let (d, n) = mse_parts(b, 0, 1)?;
    let sq = b.binary(BinaryOp::Mul, d, d)?;
    let reduction = b.int_arg(2)?;
    let out = reduce_loss(b, sq, reduction, n)?;
    b.output(out)
}

fn mse_loss_backward(b: &mut Builder) -> Result<()> {
    let (d, n) = mse_parts(b, 1, 2)?;
    let dtype = b.dtype(d);
    let dims = b.dims(d);
    let reduction = b.int_arg(3)?;
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let g = b.broadcast_to(g, &dims)?;
    let scale = if reduction == 1 { 2.0 / n as f64 } else { 2.0 };
    let s = b.constant(Literal::Float(scale), dtype, &dims);
    let gd = b.binary(BinaryOp::Mul, g, d)?;
    let out = b.binary(BinaryOp::Mul, gd, s)?;
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op("aten::_softmax", |b| softmax(b, false)),
        op("aten::_softmax.out", |b| softmax(b, false)),
        op("aten::_log_softmax", |b| softmax(b, true)),
        op("aten::_log_softmax.out", |b| softmax(b, true)),
        op("aten::_softmax_backward_data", |b| {
            softmax_backward(b, false)
        }),
        op("aten::_softmax_backward_data.out", |b| {
            softmax_backward(b, false)
        }),
        op("aten::_log_softmax_backward_data", |b| {
            softmax_backward(b, true)
        }),
        op("aten::_log_softmax_backward_data.out", |b| {
            softmax_backward(b, true)
        }),
        op("aten::nll_loss_forward", nll_loss_forward),
        op("aten::nll_loss_backward", nll_loss_backward),
        op("aten::mse_loss", mse_loss),
        op("aten::mse_loss.out", mse_loss),
        op("aten::mse_loss_backward", mse_loss_backward),
        op("aten::mse_loss_backward.grad_input", mse_loss_backward),
    ]
}
