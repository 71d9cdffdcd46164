//! Comparisons and selection: eq/ne/lt/le/gt/ge, maximum/minimum, clamp,
//! where; value tests (isnan, isinf, signbit) and set membership (isin).

use super::{
    broadcast_all, finish, is_float, operand, operand_pair, result_type, Arith, Form, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

fn compare(b: &mut Builder, dir: CompareDir) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let (x, y) = operand_pair(b, (0, 1), dtype)?;
    let out = b.compare(dir, x, y)?;
    b.output(out)
}

/// maximum/minimum: NaN where either operand is NaN.
fn min_max(b: &mut Builder, op: BinaryOp) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let (x, y) = operand_pair(b, (0, 1), dtype)?;
    let out = if op == BinaryOp::Max {
        b.maximum(x, y)?
    } else {
        b.minimum(x, y)?
    };
    b.output(out)
}

/// clamp(self, min, max) with Scalar or Tensor bounds, either optional: as
/// minimum(maximum(self, min), max), so a NaN in self or in a bound gives
/// NaN, as in torch.
fn clamp(
    b: &mut Builder,
    min_index: Option<usize>,
    max_index: Option<usize>,
    form: Form,
) -> Result<()> {
    let present =
        |b: &Builder, i: Option<usize>| i.filter(|&i| !matches!(b.arg(i), Ok(Arg::None) | Err(_)));
    let (lo, hi) = (present(b, min_index), present(b, max_index));
    if lo.is_none() && hi.is_none() {
        return Err(Error::invalid(
            format!("{}: bounds", b.op_name()),
            "at least one of min or max",
            "neither",
        ));
    }
    let indices: Vec<usize> = [Some(0), lo, hi].into_iter().flatten().collect();
    let dtype = result_type(b, &indices)?;
    let mut x = operand(b, 0, dtype)?;
    for (bound, upper) in [(lo, false), (hi, true)] {
        if let Some(i) = bound {
            let m = operand(b, i, dtype)?;
            let [xb, mb] = broadcast_all(b, &[x, m])?[..] else {
                unreachable!("two values in, two out")
            };
            x = if upper {
                b.minimum(xb, mb)?
            } else {
                b.maximum(xb, mb)?
            };
        }
    }
    finish(b, form, x)
}

fn where_self(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[1, 2])?;
    let c = b.tensor(0)?;
    let c = b.convert(c, DType::Bool);
    let x = operand(b, 1, dtype)?;
    let y = operand(b, 2, dtype)?;
    let [c, x, y] = broadcast_all(b, &[c, x, y])?[..] else {
        unreachable!("three values in, three out")
    };
    let out = b.select(c, x, y)?;
    b.output(out)
}

/// isnan: x != x for floats, all false otherwise.
fn isnan(b: &mut Builder) -> Result<()> {
    let x = b.tensor(0)?;
    let out = if is_float(b.dtype(x)) {
        b.compare(CompareDir::Ne, x, x)?
    } else {
        b.constant(Literal::Bool(false), DType::Bool, &b.dims(x))
    };
    b.output(out)
}

/// Which infinities isinf / isposinf / isneginf look for (isfinite
/// decomposes in ATen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inf {
    Either,
    Positive,
    Negative,
}

fn is_inf(b: &mut Builder, which: Inf) -> Result<()> {
    let x = b.tensor(0)?;
    let dims = b.dims(x);
    let dtype = b.dtype(x);
    if !is_float(dtype) {
        let out = b.constant(Literal::Bool(false), DType::Bool, &dims);
        return b.output(out);
    }
    let out = match which {
        Inf::Positive => {
            let inf = b.constant(Literal::Float(f64::INFINITY), dtype, &dims);
            b.compare(CompareDir::Eq, x, inf)?
        }
        Inf::Negative => {
            let ninf = b.constant(Literal::Float(f64::NEG_INFINITY), dtype, &dims);
            b.compare(CompareDir::Eq, x, ninf)?
        }
        Inf::Either => {
            let inf = b.constant(Literal::Float(f64::INFINITY), dtype, &dims);
            let a = b.unary(UnaryOp::Abs, x);
            b.compare(CompareDir::Eq, a, inf)?
        }
    };
    b.output(out)
}

/// True where the float's sign bit is set (also for -0.0 and -nan).
pub(super) fn sign_bit(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    let dtype = b.dtype(x);
    let int = match dtype {
        DType::F64 => DType::I64,
        DType::F16 | DType::BF16 => DType::I16,
        DType::F32 => DType::I32,
        _ => {
            let zero = b.constant(Literal::Int(0), dtype, &b.dims(x));
            return b.compare(CompareDir::Lt, x, zero);
        }
    };
    let i = b.bitcast(x, int);
    let zero = b.constant(Literal::Int(0), int, &b.dims(x));
    b.compare(CompareDir::Lt, i, zero)
}

fn signbit(b: &mut Builder) -> Result<()> {
    let x = b.tensor(0)?;
    let out = sign_bit(b, x)?;
    b.output(out)
}

/// isin.Tensor_Tensor(elements, test_elements, *, assume_unique, invert).
fn isin(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let t = operand(b, 1, dtype)?;
    let dims = b.dims(x);
    let n = b.ty(t).numel();
    let t = b.reshape(t, &[n])?;
    let mut full = dims.clone();
    full.push(n);
    let xb = b.broadcast_in_dim(x, &full, &(0..dims.len() as i64).collect::<Vec<_>>());
    let tb = b.broadcast_in_dim(t, &full, &[dims.len() as i64]);
    let eq = b.compare(CompareDir::Eq, xb, tb)?;
    let any = b.reduce(eq, ReduceOp::Or, &[dims.len() as i64]);
    let out = if b.bool_arg(3)? {
        b.unary(UnaryOp::Not, any)
    } else {
        any
    };
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use CompareDir::*;
    let mut ops = vec![
        op!("aten::isnan", isnan()),
        op!("aten::isinf", is_inf(Inf::Either)),
    ];
    ops.extend(out_overloads!(
        "aten::eq",
        ["Tensor", "Scalar"],
        compare(Eq)
    ));
    ops.extend(out_overloads!(
        "aten::ne",
        ["Tensor", "Scalar"],
        compare(Ne)
    ));
    ops.extend(out_overloads!(
        "aten::lt",
        ["Tensor", "Scalar"],
        compare(Lt)
    ));
    ops.extend(out_overloads!(
        "aten::le",
        ["Tensor", "Scalar"],
        compare(Le)
    ));
    ops.extend(out_overloads!(
        "aten::gt",
        ["Tensor", "Scalar"],
        compare(Gt)
    ));
    ops.extend(out_overloads!(
        "aten::ge",
        ["Tensor", "Scalar"],
        compare(Ge)
    ));
    ops.extend(with_out!("aten::maximum", min_max(BinaryOp::Max)));
    ops.extend(with_out!("aten::minimum", min_max(BinaryOp::Min)));
    ops.extend(forms!("aten::clamp", clamp(Some(1), Some(2))));
    ops.extend(overloads!(
        "aten::clamp",
        ["Tensor"],
        clamp(Some(1), Some(2))
    ));
    ops.extend(forms!("aten::clamp_min", clamp(Some(1), None)));
    ops.extend(overloads!(
        "aten::clamp_min",
        ["Tensor"],
        clamp(Some(1), None)
    ));
    ops.extend(forms!("aten::clamp_max", clamp(None, Some(1))));
    ops.extend(overloads!(
        "aten::clamp_max",
        ["Tensor"],
        clamp(None, Some(1))
    ));
    ops.extend(out_overloads!("aten::where", ["self"], where_self()));
    ops.extend(with_out!("aten::isposinf", is_inf(Inf::Positive)));
    ops.extend(with_out!("aten::isneginf", is_inf(Inf::Negative)));
    ops.extend(with_out!("aten::signbit", signbit()));
    ops.extend(out_overloads!("aten::isin", ["Tensor_Tensor"], isin()));
    ops
}
