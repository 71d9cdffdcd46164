//! Losses and their backwards: NLL, MSE, smooth L1 and Huber, binary
//! cross-entropy.

use super::{is_float, operand_pair, result_type, Arith, OpDef, Pass};
use crate::builder::Builder;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

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
        r => return Err(reduction_error(b, r)),
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

/// input - target, promoted and broadcast.
fn mse_difference(b: &mut Builder, input: usize, target: usize) -> Result<ValueId> {
    let dtype = result_type(b, &[input, target])?;
    let (x, t) = operand_pair(b, (input, target), dtype)?;
    b.sub(x, t)
}

/// Reduces elementwise losses per `reduction` (0 none, 1 mean, 2 sum).
fn reduce_loss(b: &mut Builder, losses: ValueId, reduction: i64) -> Result<ValueId> {
    let dims: Vec<i64> = (0..b.dims(losses).len() as i64).collect();
    let n = b.ty(losses).numel();
    match reduction {
        0 => Ok(losses),
        1 => {
            let s = b.reduce(losses, ReduceOp::Sum, &dims);
            let count = b.constant(Literal::Int(n), b.dtype(s), &[]);
            b.binary(BinaryOp::Div, s, count)
        }
        2 => Ok(b.reduce(losses, ReduceOp::Sum, &dims)),
        r => Err(reduction_error(b, r)),
    }
}

fn reduction_error(b: &Builder, reduction: i64) -> Error {
    Error::invalid(
        format!("{}: reduction", b.op_name()),
        "0 (none), 1 (mean) or 2 (sum)",
        reduction,
    )
}

/// The gradient factor of a reduced loss: grad (broadcast), / n for mean.
fn loss_grad_scale(
    b: &mut Builder,
    grad: usize,
    dims: &[i64],
    reduction: i64,
    dtype: DType,
) -> Result<ValueId> {
    let g = grad_like(b, grad, dims, dtype)?;
    if reduction == 1 {
        let n: i64 = dims.iter().product();
        let nv = b.constant(Literal::Int(n), dtype, dims);
        b.binary(BinaryOp::Div, g, nv)
    } else {
        Ok(g)
    }
}

/// The gradient argument `grad` as `dtype`, broadcast to `dims`.
fn grad_like(b: &mut Builder, grad: usize, dims: &[i64], dtype: DType) -> Result<ValueId> {
    let g = b.tensor(grad)?;
    let g = b.convert(g, dtype);
    b.broadcast_to(g, dims)
}

fn mse_loss(b: &mut Builder) -> Result<()> {
    let d = mse_difference(b, 0, 1)?;
    let sq = b.binary(BinaryOp::Mul, d, d)?;
    let reduction = b.int_arg(2)?;
    let out = reduce_loss(b, sq, reduction)?;
    b.output(out)
}

fn mse_loss_backward(b: &mut Builder) -> Result<()> {
    let d = mse_difference(b, 1, 2)?;
    let (dtype, dims, n) = (b.dtype(d), b.dims(d), b.ty(d).numel());
    let reduction = b.int_arg(3)?;
    let g = grad_like(b, 0, &dims, dtype)?;
    let scale = if reduction == 1 { 2.0 / n as f64 } else { 2.0 };
    let s = b.constant(Literal::Float(scale), dtype, &dims);
    let gd = b.binary(BinaryOp::Mul, g, d)?;
    let out = b.binary(BinaryOp::Mul, gd, s)?;
    b.output(out)
}

/// smooth_l1 (beta) and huber (delta) losses, forward (self, target,
/// reduction, param) and backward (grad, self, target, reduction, param).
fn smooth_loss(b: &mut Builder, huber: bool, pass: Pass) -> Result<()> {
    let first = pass.first_arg();
    let dtype = result_type(b, &[first, first + 1])?;
    let (x, t) = operand_pair(b, (first, first + 1), dtype)?;
    let reduction = b.int_arg(first + 2)?;
    let param = b.float_arg(first + 3)?;
    let d = b.binary(BinaryOp::Sub, x, t)?;
    let a = b.unary(UnaryOp::Abs, d);
    let pv = b.float_like(param, a);
    let small = b.compare(CompareDir::Lt, a, pv)?;
    if pass == Pass::Backward {
        let dims = b.dims(d);
        let g = loss_grad_scale(b, 0, &dims, reduction, dtype)?;
        // d/dx: d / beta (huber: d) inside, sign(d) (huber: delta sign(d)) outside.
        let inside = if huber || param == 0.0 {
            d
        } else {
            b.binary(BinaryOp::Div, d, pv)?
        };
        let sign = b.unary(UnaryOp::Sign, d);
        let outside = if huber {
            b.binary(BinaryOp::Mul, sign, pv)?
        } else {
            sign
        };
        let dl = b.select(small, inside, outside)?;
        let out = b.binary(BinaryOp::Mul, g, dl)?;
        return b.output(out);
    }
    let half = b.float_like(0.5, d);
    let sq = b.binary(BinaryOp::Mul, d, d)?;
    let hsq = b.binary(BinaryOp::Mul, half, sq)?;
    let (inside, outside) = if huber {
        let hp = b.binary(BinaryOp::Mul, half, pv)?;
        let ahp = b.binary(BinaryOp::Sub, a, hp)?;
        (hsq, b.binary(BinaryOp::Mul, pv, ahp)?)
    } else {
        let inside = if param == 0.0 {
            hsq
        } else {
            b.binary(BinaryOp::Div, hsq, pv)?
        };
        let hp = b.binary(BinaryOp::Mul, half, pv)?;
        (inside, b.binary(BinaryOp::Sub, a, hp)?)
    };
    let losses = b.select(small, inside, outside)?;
    let out = reduce_loss(b, losses, reduction)?;
    b.output(out)
}

/// binary_cross_entropy(self, target, weight?, reduction) with log clamped
/// at -100, and its backward (grad, self, target, weight?, reduction).
fn bce(b: &mut Builder, pass: Pass) -> Result<()> {
    let first = pass.first_arg();
    let x = b.tensor(first)?;
    let dtype = b.dtype(x);
    let dims = b.dims(x);
    let t = b.tensor(first + 1)?;
    let t = b.convert(t, dtype);
    let t = b.broadcast_to(t, &dims)?;
    let w = match b.opt_tensor_arg(first + 2)? {
        Some(_) => {
            let w = b.tensor(first + 2)?;
            let w = b.convert(w, dtype);
            Some(b.broadcast_to(w, &dims)?)
        }
        None => None,
    };
    let reduction = b.int_arg(first + 3)?;
    let one = b.float_like(1.0, x);
    let omx = b.binary(BinaryOp::Sub, one, x)?;
    let out = if pass == Pass::Backward {
        // g w (x - t) / max(x (1 - x), 1e-12)
        let g = loss_grad_scale(b, 0, &dims, reduction, dtype)?;
        let num = b.binary(BinaryOp::Sub, x, t)?;
        let den = b.binary(BinaryOp::Mul, x, omx)?;
        let eps = b.float_like(1e-12, den);
        let den = b.binary(BinaryOp::Max, den, eps)?;
        let q = b.binary(BinaryOp::Div, num, den)?;
        let q = b.binary(BinaryOp::Mul, g, q)?;
        match w {
            Some(w) => b.binary(BinaryOp::Mul, q, w)?,
            None => q,
        }
    } else {
        let floor = b.float_like(-100.0, x);
        let lx = b.unary(UnaryOp::Log, x);
        let lx = b.binary(BinaryOp::Max, lx, floor)?;
        let l1x = b.unary(UnaryOp::Log, omx);
        let l1x = b.binary(BinaryOp::Max, l1x, floor)?;
        let omt = b.binary(BinaryOp::Sub, one, t)?;
        let p = b.binary(BinaryOp::Mul, t, lx)?;
        let q = b.binary(BinaryOp::Mul, omt, l1x)?;
        let s = b.binary(BinaryOp::Add, p, q)?;
        let l = b.unary(UnaryOp::Neg, s);
        let l = match w {
            Some(w) => b.binary(BinaryOp::Mul, l, w)?,
            None => l,
        };
        reduce_loss(b, l, reduction)?
    };
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = vec![
        op!("aten::nll_loss_forward", nll_loss_forward()),
        op!("aten::nll_loss_backward", nll_loss_backward()),
    ];
    ops.extend(with_out!("aten::mse_loss", mse_loss()));
    ops.extend(backward_of!("aten::mse_loss", mse_loss_backward()));
    ops.extend(with_out!(
        "aten::huber_loss",
        smooth_loss(true, Pass::Forward)
    ));
    ops.extend(with_out!(
        "aten::huber_loss_backward",
        smooth_loss(true, Pass::Backward)
    ));
    ops.extend(with_backward!("aten::smooth_l1_loss", smooth_loss(false)));
    ops.extend(with_backward!("aten::binary_cross_entropy", bce()));
    ops
}
