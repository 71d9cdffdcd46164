//! Optimizer steps PyTorch runs as one kernel: the fused Adam, AdamW and SGD
//! steps (`fused=True`, the Trainer's `adamw_torch_fused`) and GradScaler's
//! unscale-and-check and scale update. One program updates every tensor of
//! the lists, computing in float32 as PyTorch's kernels compute in their
//! op-math type. Hyperparameters are device inputs, so a scheduled learning
//! rate does not recompile. A `found_inf` that is set leaves every tensor as
//! it was (the step GradScaler skips).

use super::OpDef;
use crate::builder::{Arg, Builder, TensorArg};
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

/// A float32 scalar input of the program.
fn scalar(b: &mut Builder, value: f64) -> ValueId {
    b.scalar_input(Literal::Float(value), DType::F32)
}

/// Argument `index` as a float32 scalar: a float, or a one-element tensor
/// (the `.tensor_lr` overloads).
fn scalar_or_tensor(b: &mut Builder, index: usize) -> Result<ValueId> {
    match b.arg(index)? {
        Arg::Tensor(t) => {
            let v = b.read(t)?;
            let v = b.convert(v, DType::F32);
            b.reshape(v, &[])
        }
        _ => {
            let v = b.float_arg(index)?;
            Ok(scalar(b, v))
        }
    }
}

/// Scalar `x` broadcast to `dims`.
fn spread(b: &mut Builder, x: ValueId, dims: &[i64]) -> Result<ValueId> {
    b.broadcast_to(x, dims)
}

/// The elementwise `x op scalar`.
fn with_scalar(b: &mut Builder, op: BinaryOp, x: ValueId, s: ValueId) -> Result<ValueId> {
    let dims = b.dims(x);
    let s = spread(b, s, &dims)?;
    b.binary(op, x, s)
}

/// The float32 scalar of optional argument `index` (a grad_scale).
fn grad_scale(b: &mut Builder, index: usize) -> Result<Option<ValueId>> {
    let Some(t) = b.opt_tensor_arg(index)? else {
        return Ok(None);
    };
    let v = read_f32(b, t)?;
    Ok(Some(b.reshape(v, &[])?))
}

/// The predicate "skip this step": `found_inf` is nonzero.
fn skipped(b: &mut Builder, found_inf: Option<&TensorArg>) -> Result<Option<ValueId>> {
    let Some(found_inf) = found_inf else {
        return Ok(None);
    };
    let f = b.read(found_inf)?;
    let f = b.convert(f, DType::F32);
    let f = b.reshape(f, &[])?;
    let zero = b.constant(Literal::Float(0.0), DType::F32, &[]);
    Ok(Some(b.compare(CompareDir::Ne, f, zero)?))
}

/// Writes `new` (float32) into `target`, or leaves `target` as it was when
/// the step is skipped.
fn store(b: &mut Builder, target: &TensorArg, new: ValueId, skip: Option<ValueId>) -> Result<()> {
    let new = b.convert(new, target.view.dtype);
    let value = match skip {
        None => new,
        Some(skip) => {
            let old = b.read(target)?;
            let dims = b.dims(new);
            let skip = spread(b, skip, &dims)?;
            b.select(skip, old, new)?
        }
    };
    b.write(target, value)
}

/// Reads a list element as float32.
fn read_f32(b: &mut Builder, t: &TensorArg) -> Result<ValueId> {
    let v = b.read(t)?;
    Ok(b.convert(v, DType::F32))
}

/// List argument `index`, as long as the parameter list (`n`); an empty
/// list is allowed where `may_be_empty`.
fn list<'a>(
    b: &Builder<'a>,
    index: usize,
    n: usize,
    may_be_empty: bool,
) -> Result<Vec<&'a TensorArg>> {
    let list = b.tensor_list_arg(index)?;
    if list.len() != n && !(may_be_empty && list.is_empty()) {
        return Err(b.arg_error(
            index,
            format!("{n} tensors (as many as params)"),
            list.len(),
        ));
    }
    Ok(list)
}

/// The gradient as the step uses it: unscaled by `grad_scale` (and written
/// back so, as PyTorch's fused kernels do), negated to maximize.
fn step_gradient(
    b: &mut Builder,
    grad: &TensorArg,
    grad_scale: Option<ValueId>,
    maximize: bool,
    skip: Option<ValueId>,
) -> Result<ValueId> {
    let mut g = read_f32(b, grad)?;
    if let Some(scale) = grad_scale {
        g = with_scalar(b, BinaryOp::Div, g, scale)?;
        store(b, grad, g, skip)?;
    }
    Ok(if maximize {
        b.unary(UnaryOp::Neg, g)
    } else {
        g
    })
}

/// `_fused_adam_` (L2 weight decay added to the gradient) and
/// `_fused_adamw_` (`decoupled`: the parameter decays by `lr * weight_decay`).
fn fused_adam(b: &mut Builder, decoupled: bool) -> Result<()> {
    let params = b.tensor_list_arg(0)?;
    let n = params.len();
    let (amsgrad, maximize) = (b.bool_arg(11)?, b.bool_arg(12)?);
    let grads = list(b, 1, n, false)?;
    let exp_avgs = list(b, 2, n, false)?;
    let exp_avg_sqs = list(b, 3, n, false)?;
    let max_exp_avg_sqs = list(b, 4, n, !amsgrad)?;
    let steps = list(b, 5, n, false)?;
    let lr = scalar_or_tensor(b, 6)?;
    let (beta1, beta2) = (b.float_arg(7)?, b.float_arg(8)?);
    let (weight_decay, eps) = (b.float_arg(9)?, b.float_arg(10)?);
    let grad_scale = grad_scale(b, 13)?;
    let skip = skipped(b, b.opt_tensor_arg(14)?)?;
    let one = scalar(b, 1.0);
    let beta1_v = scalar(b, beta1);
    let beta2_v = scalar(b, beta2);
    let one_minus_beta1 = scalar(b, 1.0 - beta1);
    let one_minus_beta2 = scalar(b, 1.0 - beta2);
    let weight_decay_v = scalar(b, weight_decay);
    let eps_v = scalar(b, eps);
    for i in 0..n {
        let mut g = step_gradient(b, grads[i], grad_scale, maximize, skip)?;
        let mut p = read_f32(b, params[i])?;
        if weight_decay != 0.0 {
            if decoupled {
                let decay = b.binary(BinaryOp::Mul, lr, weight_decay_v)?;
                let keep = b.binary(BinaryOp::Sub, one, decay)?;
                p = with_scalar(b, BinaryOp::Mul, p, keep)?;
            } else {
                let decay = with_scalar(b, BinaryOp::Mul, p, weight_decay_v)?;
                g = b.binary(BinaryOp::Add, g, decay)?;
            }
        }
        let m = read_f32(b, exp_avgs[i])?;
        let m = with_scalar(b, BinaryOp::Mul, m, beta1_v)?;
        let gm = with_scalar(b, BinaryOp::Mul, g, one_minus_beta1)?;
        let m = b.binary(BinaryOp::Add, m, gm)?;
        let v = read_f32(b, exp_avg_sqs[i])?;
        let v = with_scalar(b, BinaryOp::Mul, v, beta2_v)?;
        let gg = b.binary(BinaryOp::Mul, g, g)?;
        let gg = with_scalar(b, BinaryOp::Mul, gg, one_minus_beta2)?;
        let v = b.binary(BinaryOp::Add, v, gg)?;
        // Bias corrections from the (already incremented) step count.
        let step = read_f32(b, steps[i])?;
        let step = b.reshape(step, &[])?;
        let beta1_t = b.binary(BinaryOp::Pow, beta1_v, step)?;
        let beta2_t = b.binary(BinaryOp::Pow, beta2_v, step)?;
        let bias1 = b.binary(BinaryOp::Sub, one, beta1_t)?;
        let bias2 = b.binary(BinaryOp::Sub, one, beta2_t)?;
        let step_size = b.binary(BinaryOp::Div, lr, bias1)?;
        let bias2_sqrt = b.unary(UnaryOp::Sqrt, bias2);
        let second = if amsgrad {
            let old = read_f32(b, max_exp_avg_sqs[i])?;
            let most = b.binary(BinaryOp::Max, old, v)?;
            store(b, max_exp_avg_sqs[i], most, skip)?;
            most
        } else {
            v
        };
        let root = b.unary(UnaryOp::Sqrt, second);
        let denom = with_scalar(b, BinaryOp::Div, root, bias2_sqrt)?;
        let denom = with_scalar(b, BinaryOp::Add, denom, eps_v)?;
        let update = b.binary(BinaryOp::Div, m, denom)?;
        let update = with_scalar(b, BinaryOp::Mul, update, step_size)?;
        let p = b.binary(BinaryOp::Sub, p, update)?;
        store(b, params[i], p, skip)?;
        store(b, exp_avgs[i], m, skip)?;
        store(b, exp_avg_sqs[i], v, skip)?;
    }
    Ok(())
}

/// `_fused_sgd_`: SGD with weight decay, momentum, dampening and Nesterov.
fn fused_sgd(b: &mut Builder) -> Result<()> {
    let params = b.tensor_list_arg(0)?;
    let n = params.len();
    let (weight_decay, momentum) = (b.float_arg(3)?, b.float_arg(4)?);
    let grads = list(b, 1, n, false)?;
    let buffers = list(b, 2, n, momentum == 0.0)?;
    let lr = scalar_or_tensor(b, 5)?;
    let dampening = b.float_arg(6)?;
    let (nesterov, maximize, first_step) = (b.bool_arg(7)?, b.bool_arg(8)?, b.bool_arg(9)?);
    let grad_scale = grad_scale(b, 10)?;
    let skip = skipped(b, b.opt_tensor_arg(11)?)?;
    let weight_decay_v = scalar(b, weight_decay);
    let momentum_v = scalar(b, momentum);
    let undamped = scalar(b, 1.0 - dampening);
    for i in 0..n {
        let mut g = step_gradient(b, grads[i], grad_scale, maximize, skip)?;
        let p = read_f32(b, params[i])?;
        if weight_decay != 0.0 {
            let decay = with_scalar(b, BinaryOp::Mul, p, weight_decay_v)?;
            g = b.binary(BinaryOp::Add, g, decay)?;
        }
        if momentum != 0.0 {
            let buffer = if first_step {
                g
            } else {
                let old = read_f32(b, buffers[i])?;
                let kept = with_scalar(b, BinaryOp::Mul, old, momentum_v)?;
                let added = with_scalar(b, BinaryOp::Mul, g, undamped)?;
                b.binary(BinaryOp::Add, kept, added)?
            };
            store(b, buffers[i], buffer, skip)?;
            g = if nesterov {
                let ahead = with_scalar(b, BinaryOp::Mul, buffer, momentum_v)?;
                b.binary(BinaryOp::Add, g, ahead)?
            } else {
                buffer
            };
        }
        let update = with_scalar(b, BinaryOp::Mul, g, lr)?;
        let p = b.binary(BinaryOp::Sub, p, update)?;
        store(b, params[i], p, skip)?;
    }
    Ok(())
}

/// GradScaler's unscale: each tensor times `inv_scale`, and `found_inf` set
/// to 1 when any value was not finite.
fn unscale_and_check(b: &mut Builder) -> Result<()> {
    let tensors = b.tensor_list_arg(0)?;
    let found_inf = b.tensor_arg(1)?;
    let inv_scale = read_f32(b, b.tensor_arg(2)?)?;
    let inv_scale = b.reshape(inv_scale, &[])?;
    let mut all_finite = b.constant(Literal::Bool(true), DType::Bool, &[]);
    for t in tensors {
        let x = read_f32(b, t)?;
        let dims = b.dims(x);
        // NaN compares false, so |x| < inf is "finite".
        let inf = b.constant(Literal::Float(f64::INFINITY), DType::F32, &dims);
        let magnitude = b.unary(UnaryOp::Abs, x);
        let finite = b.compare(CompareDir::Lt, magnitude, inf)?;
        let all: Vec<i64> = (0..dims.len() as i64).collect();
        let finite = b.reduce(finite, ReduceOp::And, &all);
        all_finite = b.binary(BinaryOp::And, all_finite, finite)?;
        let unscaled = with_scalar(b, BinaryOp::Mul, x, inv_scale)?;
        b.write(t, unscaled)?;
    }
    let old = read_f32(b, found_inf)?;
    let dims = b.dims(old);
    let one = b.constant(Literal::Float(1.0), DType::F32, &dims);
    let all_finite = spread(b, all_finite, &dims)?;
    let found = b.select(all_finite, old, one)?;
    b.write(found_inf, found)
}

/// GradScaler's update: back off after an inf; grow after
/// `growth_interval` good steps in a row.
fn update_scale(b: &mut Builder) -> Result<()> {
    let scale_arg = b.tensor_arg(0)?;
    let tracker_arg = b.tensor_arg(1)?;
    let scale = read_f32(b, scale_arg)?;
    let dims = b.dims(scale);
    let tracker = b.read(tracker_arg)?;
    let tracker = b.convert(tracker, DType::I32);
    let found = read_f32(b, b.tensor_arg(2)?)?;
    let growth = b.float_arg(3)?;
    let backoff = b.float_arg(4)?;
    let interval = b.int_arg(5)?;
    let zero_f = b.constant(Literal::Float(0.0), DType::F32, &dims);
    let inf_found = b.compare(CompareDir::Ne, found, zero_f)?;
    let one_i = b.constant(Literal::Int(1), DType::I32, &dims);
    let zero_i = b.constant(Literal::Int(0), DType::I32, &dims);
    let interval_i = b.scalar_input(Literal::Int(interval), DType::I32);
    let interval_i = spread(b, interval_i, &dims)?;
    let successful = b.binary(BinaryOp::Add, tracker, one_i)?;
    let grow = b.compare(CompareDir::Eq, successful, interval_i)?;
    let growth_v = scalar(b, growth);
    let grown = with_scalar(b, BinaryOp::Mul, scale, growth_v)?;
    // A scale that would overflow stays as it is.
    let inf = b.constant(Literal::Float(f64::INFINITY), DType::F32, &dims);
    let grown_finite = b.compare(CompareDir::Lt, grown, inf)?;
    let grown = b.select(grown_finite, grown, scale)?;
    let backoff_v = scalar(b, backoff);
    let backed_off = with_scalar(b, BinaryOp::Mul, scale, backoff_v)?;
    let kept_or_grown = b.select(grow, grown, scale)?;
    let new_scale = b.select(inf_found, backed_off, kept_or_grown)?;
    let counted = b.select(grow, zero_i, successful)?;
    let new_tracker = b.select(inf_found, zero_i, counted)?;
    b.write(tracker_arg, new_tracker)?;
    b.write_arg(0, new_scale)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op!("aten::_fused_adam_", fused_adam(false)),
        op!("aten::_fused_adam_.tensor_lr", fused_adam(false)),
        op!("aten::_fused_adamw_", fused_adam(true)),
        op!("aten::_fused_adamw_.tensor_lr", fused_adam(true)),
        op!("aten::_fused_sgd_", fused_sgd()),
        op!("aten::_fused_sgd_.tensor_lr", fused_sgd()),
        op!(
            "aten::_amp_foreach_non_finite_check_and_unscale_",
            unscale_and_check()
        ),
        op!("aten::_amp_update_scale_", update_scale()),
    ]
}
