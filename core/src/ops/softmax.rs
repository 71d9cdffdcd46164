//! Softmax and log-softmax along one dim, and their backwards.

use super::{accumulate_dtype, at_least_1d, require_float, wrap_dim, OpDef};
use crate::builder::Builder;
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{BinaryOp, ReduceOp, UnaryOp, ValueId};

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
fn softmax_input(b: &mut Builder) -> Result<(ValueId, usize, Dims)> {
    let view = b.tensor_arg(0)?.view.clone();
    require_float(b, "input", view.dtype)?;
    let dim = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let x = b.tensor(0)?;
    let x = b.reshape(x, &at_least_1d(&view.sizes))?;
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
    let x = b.convert(x, accumulate_dtype(input_dtype));
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
    let work = at_least_1d(&view.sizes);
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

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = Vec::new();
    ops.extend(with_out!("aten::_softmax", softmax(false)));
    ops.extend(with_out!("aten::_log_softmax", softmax(true)));
    ops.extend(with_out!(
        "aten::_softmax_backward_data",
        softmax_backward(false)
    ));
    ops.extend(with_out!(
        "aten::_log_softmax_backward_data",
        softmax_backward(true)
    ));
    ops
}
