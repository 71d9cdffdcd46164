//! Factories and fills: arange, linspace, logspace and eye fill their
//! `out=` tensor; fill_, zero_ and copy_ write into self.

use super::{broadcast_scalar, is_float, wide_float, Arith, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ValueId};

/// arange(start, end, step, *, out): the values in out's dtype.
fn arange(b: &mut Builder) -> Result<()> {
    let (start, end, step) = (b.float_arg(0)?, b.float_arg(1)?, b.float_arg(2)?);
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
        return Err(Error::invalid(
            "aten::arange: range",
            "finite start/end and a non-zero step",
            format!("({start}, {end}, {step})"),
        ));
    }
    if (end - start) / step < 0.0 {
        return Err(Error::invalid(
            "aten::arange: range",
            "upper and lower bounds consistent with the step sign",
            format!("({start}, {end}, {step})"),
        ));
    }
    let dtype = b.tensor_arg(3)?.view.dtype;
    let integral = [0, 1, 2]
        .iter()
        .all(|&i| matches!(b.arg(i), Ok(Arg::Int(_))));
    let n = if integral {
        let (s, e, st) = (b.int_arg(0)?, b.int_arg(1)?, b.int_arg(2)?);
        ((e - s) + st - st.signum()) / st
    } else {
        ((end - start) / step).ceil() as i64
    };
    let work = if is_float(dtype) { dtype } else { DType::I64 };
    let i = b.iota(work, &[n], 0);
    let st = broadcast_scalar(b, 2, work, &[n])?;
    let s = broadcast_scalar(b, 0, work, &[n])?;
    let scaled = b.binary(BinaryOp::Mul, i, st)?;
    let out = b.binary(BinaryOp::Add, s, scaled)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// The `steps` argument (2) and the evenly spaced points `start + i step`
/// from `start` to `end` (arguments 0 and 1) in `work`: (steps, i, the
/// step as a device value, the points).
fn ramp(b: &mut Builder, work: DType) -> Result<(i64, ValueId, ValueId, ValueId)> {
    let steps = b.int_arg(2)?;
    if steps < 0 {
        return Err(b.arg_error(2, "steps >= 0", steps));
    }
    let (start, end) = (b.float_arg(0)?, b.float_arg(1)?);
    let n = [steps];
    let step = if steps > 1 {
        (end - start) / (steps - 1) as f64
    } else {
        0.0
    };
    let i = b.iota(work, &n, 0);
    let s = b.scalar_input(Literal::Float(start), work);
    let s = b.broadcast_to(s, &n)?;
    let st = b.scalar_input(Literal::Float(step), work);
    let st = b.broadcast_to(st, &n)?;
    let scaled = b.mul(i, st)?;
    let points = b.add(s, scaled)?;
    Ok((steps, i, st, points))
}

/// linspace(start, end, steps, *, out): ATen's two-sided formula (from the
/// start for the first half, from the end for the rest), in out's dtype.
fn linspace(b: &mut Builder) -> Result<()> {
    let dtype = b.tensor_arg(3)?.view.dtype;
    let work = if is_float(dtype) { dtype } else { DType::F64 };
    let (steps, i, st, from_start) = ramp(b, work)?;
    let n = [steps];
    let e = b.scalar_input(Literal::Float(b.float_arg(1)?), work);
    let e = b.broadcast_to(e, &n)?;
    let last = b.constant(Literal::Int(steps - 1), work, &n);
    let back = b.sub(last, i)?;
    let from_end = b.mul(back, st)?;
    let from_end = b.sub(e, from_end)?;
    // The first half counts from start (all of it for one step).
    let half = b.constant(Literal::Int((steps / 2).max(1)), work, &n);
    let first_half = b.compare(CompareDir::Lt, i, half)?;
    let out = b.select(first_half, from_start, from_end)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// logspace.out(start, end, steps, base, *, out): base ** linspace.
fn logspace(b: &mut Builder) -> Result<()> {
    let dtype = b.tensor_arg(4)?.view.dtype;
    let work = wide_float(dtype);
    let (steps, _, _, e) = ramp(b, work)?;
    let bv = b.scalar_input(Literal::Float(b.float_arg(3)?), work);
    let bv = b.broadcast_to(bv, &[steps])?;
    let out = b.binary(BinaryOp::Pow, bv, e)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// eye.out(n, *, out) / eye.m_out(n, m, *, out).
fn eye(b: &mut Builder, with_m: bool) -> Result<()> {
    let n = b.int_arg(0)?;
    let m = if with_m { b.int_arg(1)? } else { n };
    if n < 0 || m < 0 {
        return Err(Error::invalid(
            "aten::eye: sizes",
            "n, m >= 0",
            format!("{n}, {m}"),
        ));
    }
    let dtype = b.tensor_arg(if with_m { 2 } else { 1 })?.view.dtype;
    let i = b.iota(DType::I64, &[n, m], 0);
    let j = b.iota(DType::I64, &[n, m], 1);
    let diag = b.compare(CompareDir::Eq, i, j)?;
    let out = b.convert(diag, dtype);
    b.output(out)
}

fn fill_scalar(b: &mut Builder) -> Result<()> {
    let dtype = b.tensor_arg(0)?.view.dtype;
    let v = if b.is_scalar(1) {
        b.scalar_arg(1, dtype)?
    } else {
        let t = b.tensor_arg(1)?;
        if !t.view.sizes.is_empty() {
            return Err(b.arg_error(
                1,
                "a 0-dimensional value tensor",
                format!("sizes {:?}", t.view.sizes),
            ));
        }
        let v = b.tensor(1)?;
        b.convert(v, dtype)
    };
    b.write_arg(0, v)
}

fn zero(b: &mut Builder) -> Result<()> {
    let dtype = b.tensor_arg(0)?.view.dtype;
    let z = b.constant(Literal::Int(0), dtype, &[]);
    b.write_arg(0, z)
}

/// copy_(self, src): converts and broadcasts `src` into `self`.
fn copy(b: &mut Builder) -> Result<()> {
    let dst = b.tensor_arg(0)?.view.clone();
    let src = b.tensor(1)?;
    let src = b.convert(src, dst.dtype);
    let src = b.broadcast_to(src, &dst.sizes)?;
    b.write_arg(0, src)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op!("aten::arange.start_out", arange()),
        op!("aten::linspace.out", linspace()),
        op!("aten::logspace.out", logspace()),
        op!("aten::eye.out", eye(false)),
        op!("aten::eye.m_out", eye(true)),
        op!("aten::fill_.Scalar", fill_scalar()),
        op!("aten::fill_.Tensor", fill_scalar()),
        op!("aten::zero_", zero()),
        op!("aten::copy_", copy()),
    ]
}
