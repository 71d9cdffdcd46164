//! Binary elementwise arithmetic: add/sub (with alpha), rsub, mul, div
//! (with rounding modes), pow, the integer-aware and bitwise/logical ops,
//! the special functions (xlogy, logaddexp, copysign, ...), and the
//! three-operand addcmul/addcdiv and lerp.

use super::compare::sign_bit;
use super::unary::trunc;
use super::{
    accumulate_dtype, binary_operands, broadcast_all, finish, is_float, is_integral, operand,
    operand_pair, result_type, Arith, Form, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, UnaryOp, ValueId};

/// `self op (alpha * other)` for add/sub, with an optional `alpha` at 2.
fn add_sub(b: &mut Builder, op: BinaryOp, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    if op == BinaryOp::Sub && dtype == DType::Bool {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "non-bool tensors (use logical_xor or ~ for bools)",
            "two bool tensors",
        ));
    }
    let x = operand(b, 0, dtype)?;
    let mut y = operand(b, 1, dtype)?;
    if b.num_args() > 2 && !matches!(b.arg(2)?, Arg::Int(1) | Arg::None) {
        let alpha = b.scalar_arg(2, dtype)?;
        let dims = b.dims(y);
        let alpha = b.broadcast_to(alpha, &dims)?;
        y = b.mul(y, alpha)?;
    }
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let out = b.binary(op, x, y)?;
    finish(b, form, out)
}

/// rsub(self, other, alpha) = other - alpha * self.
fn rsub(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let (x, y) = operand_pair(b, (0, 1), dtype)?;
    let x = if matches!(b.arg(2), Ok(Arg::Int(1)) | Err(_)) {
        x
    } else {
        let a = b.scalar_arg(2, dtype)?;
        let a = b.broadcast_to(a, &b.dims(x))?;
        b.mul(x, a)?
    };
    let out = b.sub(y, x)?;
    b.output(out)
}

/// mul and pow: `op` on the promoted, broadcast operands.
fn promoted(b: &mut Builder, op: BinaryOp, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let (x, y) = operand_pair(b, (0, 1), dtype)?;
    let is_mask = |b: &Builder, i: usize| matches!(b.arg(i), Ok(Arg::Tensor(t)) if t.view.dtype == DType::Bool);
    let mask = [0, 1].into_iter().find(|&i| is_mask(b, i));
    let out = match mask {
        Some(i) if op == BinaryOp::Mul && is_float(dtype) => {
            // XLA rewrites a float times a converted bool as a select of 0,
            // which loses inf * 0 = NaN (autograd's masked gradients, amax's
            // among them, would drop NaN); a select of x * 0 keeps it.
            let other = if i == 0 { y } else { x };
            let keep = b.tensor(i)?;
            let keep = b.broadcast_to(keep, &b.dims(other))?;
            let zero = b.float_like(0.0, other);
            let masked = b.mul(other, zero)?;
            b.select(keep, other, masked)?
        }
        _ => b.binary(op, x, y)?,
    };
    finish(b, form, out)
}

/// True division (integers promote to float32), or with a rounding mode
/// (`"trunc"`/`"floor"`) at `mode_index`.
fn div(b: &mut Builder, mode_index: Option<usize>, form: Form) -> Result<()> {
    let mode = match mode_index.map(|i| b.arg(i)).transpose()? {
        None | Some(Arg::None) => None,
        Some(Arg::Str(s)) if s == "trunc" || s == "floor" => Some(s.clone()),
        Some(other) => {
            let got = match other {
                Arg::Str(s) => format!("{s:?}"),
                other => other.kind().to_string(),
            };
            return Err(b.arg_error(
                mode_index.unwrap_or(2),
                "rounding_mode None, 'trunc' or 'floor'",
                got,
            ));
        }
    };
    let promoted = result_type(b, &[0, 1])?;
    let dtype = if mode.is_none() && is_integral(promoted, true) {
        DType::F32
    } else {
        promoted
    };
    let (x, y) = operand_pair(b, (0, 1), dtype)?;
    // Rounding modes see the float32 quotient of 16-bit inputs, as in ATen.
    let acc = accumulate_dtype(dtype);
    let (x, y) = (b.convert(x, acc), b.convert(y, acc));
    let q = b.div(x, y)?;
    let out = match mode.as_deref() {
        None => q,
        Some("trunc") if is_float(dtype) => trunc(b, q)?,
        Some("floor") if is_float(dtype) => b.unary(UnaryOp::Floor, q),
        Some("floor") => floor_quotient(b, x, y, q)?,
        _ => q,
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// The floor of an integer division from its truncated quotient `q`: one
/// less where the signs differ and the division is inexact.
fn floor_quotient(b: &mut Builder, x: ValueId, y: ValueId, q: ValueId) -> Result<ValueId> {
    let (dtype, dims) = (b.dtype(q), b.dims(q));
    let r = b.binary(BinaryOp::Rem, x, y)?;
    let zero = b.constant(Literal::Int(0), dtype, &dims);
    let inexact = b.compare(CompareDir::Ne, r, zero)?;
    let xn = b.compare(CompareDir::Lt, x, zero)?;
    let yn = b.compare(CompareDir::Lt, y, zero)?;
    let differ = b.binary(BinaryOp::Xor, xn, yn)?;
    let adjust = b.binary(BinaryOp::And, inexact, differ)?;
    let one = b.constant(Literal::Int(1), dtype, &dims);
    let q1 = b.sub(q, one)?;
    b.select(adjust, q1, q)
}

/// The binary functions that promote, broadcast and compute in float32
/// for 16-bit inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binary {
    /// Sign of the divisor.
    Remainder,
    /// Sign of the dividend.
    Fmod,
    FloorDivide,
    Atan2,
    Hypot,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    Xlogy,
    Xlog1py,
    Logaddexp,
    Logaddexp2,
    Copysign,
    Fmax,
    Fmin,
    Heaviside,
}

impl Binary {
    /// Integer operands compute in float32.
    fn float_only(self) -> bool {
        use Binary::*;
        matches!(
            self,
            Atan2 | Hypot | Xlogy | Xlog1py | Logaddexp | Logaddexp2 | Copysign
        )
    }
}

fn binary(b: &mut Builder, f: Binary, form: Form) -> Result<()> {
    use Binary::*;
    let (x, y, dtype) = binary_operands(b, f.float_only())?;
    if matches!(f, BitwiseAnd | BitwiseOr | BitwiseXor) && !is_integral(dtype, true) {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "integer or bool tensors",
            dtype,
        ));
    }
    let out = match f {
        Fmod => b.binary(BinaryOp::Rem, x, y)?,
        Remainder => {
            let dims = b.dims(x);
            let r = b.binary(BinaryOp::Rem, x, y)?;
            let zero = b.constant(Literal::Int(0), b.dtype(x), &dims);
            let nonzero = b.compare(CompareDir::Ne, r, zero)?;
            let rn = b.compare(CompareDir::Lt, r, zero)?;
            let yn = b.compare(CompareDir::Lt, y, zero)?;
            let differ = b.binary(BinaryOp::Xor, rn, yn)?;
            let fix = b.binary(BinaryOp::And, nonzero, differ)?;
            let shifted = b.add(r, y)?;
            b.select(fix, shifted, r)?
        }
        FloorDivide => {
            let q = b.div(x, y)?;
            if is_float(b.dtype(q)) {
                b.unary(UnaryOp::Floor, q)
            } else {
                floor_quotient(b, x, y, q)?
            }
        }
        Atan2 => b.binary(BinaryOp::Atan2, x, y)?,
        Hypot => {
            let xx = b.mul(x, x)?;
            let yy = b.mul(y, y)?;
            let s = b.add(xx, yy)?;
            let h = b.unary(UnaryOp::Sqrt, s);
            // An infinite side gives inf, even against NaN (C's hypot).
            let inf = b.float_like(f64::INFINITY, h);
            let ax = b.unary(UnaryOp::Abs, x);
            let ay = b.unary(UnaryOp::Abs, y);
            let x_inf = b.compare(CompareDir::Eq, ax, inf)?;
            let y_inf = b.compare(CompareDir::Eq, ay, inf)?;
            let any_inf = b.binary(BinaryOp::Or, x_inf, y_inf)?;
            b.select(any_inf, inf, h)?
        }
        BitwiseAnd => b.binary(BinaryOp::And, x, y)?,
        BitwiseOr => b.binary(BinaryOp::Or, x, y)?,
        BitwiseXor => b.binary(BinaryOp::Xor, x, y)?,
        Xlogy | Xlog1py => {
            let log = if f == Xlogy {
                UnaryOp::Log
            } else {
                UnaryOp::Log1p
            };
            let l = b.unary(log, y);
            let p = b.mul(x, l)?;
            let zero = b.float_like(0.0, x);
            let x_zero = b.compare(CompareDir::Eq, x, zero)?;
            let y_nan = b.is_nan(y)?;
            let not_nan = b.unary(UnaryOp::Not, y_nan);
            let use_zero = b.binary(BinaryOp::And, x_zero, not_nan)?;
            b.select(use_zero, zero, p)?
        }
        Logaddexp | Logaddexp2 => {
            // max + log(1 + base^-(|a - b|)), exact when both are the same inf.
            let ln_base = if f == Logaddexp {
                1.0
            } else {
                std::f64::consts::LN_2
            };
            let m = b.binary(BinaryOp::Max, x, y)?;
            let d = b.sub(x, y)?;
            let d = b.unary(UnaryOp::Abs, d);
            let k = b.float_like(-ln_base, d);
            let scaled = b.mul(d, k)?;
            let e = b.unary(UnaryOp::Exp, scaled);
            let l = b.unary(UnaryOp::Log1p, e);
            let k = b.float_like(1.0 / ln_base, l);
            let l = b.mul(l, k)?;
            // Equal inputs (both infinite too) give x + log_base(2).
            let same = b.compare(CompareDir::Eq, x, y)?;
            let sum = b.add(m, l)?;
            let ln2 = b.float_like(std::f64::consts::LN_2 / ln_base, x);
            let doubled = b.add(x, ln2)?;
            b.select(same, doubled, sum)?
        }
        Copysign => {
            let a = b.unary(UnaryOp::Abs, x);
            let na = b.unary(UnaryOp::Neg, a);
            let negative = sign_bit(b, y)?;
            b.select(negative, na, a)?
        }
        Fmax | Fmin => {
            let op = if f == Fmax {
                BinaryOp::Max
            } else {
                BinaryOp::Min
            };
            let m = b.binary(op, x, y)?;
            if is_float(dtype) {
                let xn = b.is_nan(x)?;
                let yn = b.is_nan(y)?;
                let m = b.select(yn, x, m)?;
                b.select(xn, y, m)?
            } else {
                m
            }
        }
        Heaviside => {
            let zero = b.constant(Literal::Int(0), b.dtype(x), &b.dims(x));
            let one = b.constant(Literal::Int(1), b.dtype(x), &b.dims(x));
            let is_zero = b.compare(CompareDir::Eq, x, zero)?;
            let positive = b.compare(CompareDir::Gt, x, zero)?;
            let step = b.select(positive, one, zero)?;
            b.select(is_zero, y, step)?
        }
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// logical and/or/xor: the operands as bool; in place, the result in
/// self's dtype.
fn logical_binary(b: &mut Builder, op: BinaryOp, form: Form) -> Result<()> {
    // Operands that have no result type are an error here too.
    result_type(b, &[0, 1])?;
    let (x, y) = operand_pair(b, (0, 1), DType::Bool)?;
    let out = b.binary(op, x, y)?;
    let out = if form == Form::InPlace {
        let target = b.tensor_arg(0)?.view.dtype;
        b.convert(out, target)
    } else {
        out
    };
    finish(b, form, out)
}

/// Arguments 0, 1 and 2 as `dtype`, broadcast together, in float32 for
/// 16-bit floats so that the result rounds once, as in ATen.
fn three_operands(b: &mut Builder, dtype: DType) -> Result<[ValueId; 3]> {
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let z = operand(b, 2, dtype)?;
    let [x, y, z] = broadcast_all(b, &[x, y, z])?[..] else {
        unreachable!("three values in, three out")
    };
    let acc = accumulate_dtype(dtype);
    Ok([x, y, z].map(|v| b.convert(v, acc)))
}

/// `self + value * t1 * t2` (addcmul) or `self + value * t1 / t2` (addcdiv).
fn addc(b: &mut Builder, divide: bool, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1, 2])?;
    if divide && is_integral(dtype, true) {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "floating-point tensors",
            dtype,
        ));
    }
    let [x, t1, t2] = three_operands(b, dtype)?;
    let acc = b.dtype(x);
    let prod = b.binary(if divide { BinaryOp::Div } else { BinaryOp::Mul }, t1, t2)?;
    let scaled = if b.num_args() > 3 && !matches!(b.arg(3)?, Arg::Int(1)) {
        let v = b.scalar_arg(3, acc)?;
        let v = b.broadcast_to(v, &b.dims(prod))?;
        b.mul(prod, v)?
    } else {
        prod
    };
    let out = b.add(x, scaled)?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// lerp(self, end, weight) = self + weight * (end - self).
fn lerp(b: &mut Builder, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    // ATen's two-sided formula: from self for weight < 0.5, from end
    // otherwise (exact at both ends).
    let [x, e, w] = three_operands(b, dtype)?;
    let (acc, dims) = (b.dtype(x), b.dims(x));
    let d = b.sub(e, x)?;
    let s = b.mul(w, d)?;
    let near_self = b.add(x, s)?;
    let one = b.constant(Literal::Int(1), acc, &dims);
    let omw = b.sub(one, w)?;
    let t = b.mul(d, omw)?;
    let near_end = b.sub(e, t)?;
    let half = b.constant(Literal::Float(0.5), acc, &dims);
    let small = b.compare(CompareDir::Lt, w, half)?;
    let out = b.select(small, near_self, near_end)?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// `name.Tensor`, `name.out` and `name.Scalar` (functional) and
/// `name_.Tensor` and `name_.Scalar` (in place), as add/sub/mul/div have.
macro_rules! tensor_scalar {
    ($name:literal, $f:ident $args:tt) => {
        [
            form_entry!(concat!($name, ".Tensor"), Functional, $f $args),
            form_entry!(concat!($name, ".out"), Functional, $f $args),
            form_entry!(concat!($name, "_.Tensor"), InPlace, $f $args),
            form_entry!(concat!($name, ".Scalar"), Functional, $f $args),
            form_entry!(concat!($name, "_.Scalar"), InPlace, $f $args),
        ]
    };
}

pub(super) fn ops() -> Vec<OpDef> {
    use Binary::*;
    use Form::{Functional as F, InPlace as I};
    let mut ops = vec![
        op!("aten::rsub.Tensor", rsub()),
        op!("aten::rsub.Scalar", rsub()),
        op!("aten::div.Tensor_mode", div(Some(2), F)),
        op!("aten::div.out_mode", div(Some(2), F)),
        op!("aten::div_.Tensor_mode", div(Some(2), I)),
        op!("aten::div.Scalar_mode", div(Some(2), F)),
        op!("aten::div_.Scalar_mode", div(Some(2), I)),
        op!("aten::pow.Tensor_Scalar", promoted(BinaryOp::Pow, F)),
        op!("aten::pow.Tensor_Scalar_out", promoted(BinaryOp::Pow, F)),
        op!("aten::pow_.Scalar", promoted(BinaryOp::Pow, I)),
        op!("aten::pow.Tensor_Tensor", promoted(BinaryOp::Pow, F)),
        op!("aten::pow.Tensor_Tensor_out", promoted(BinaryOp::Pow, F)),
        op!("aten::pow_.Tensor", promoted(BinaryOp::Pow, I)),
        op!("aten::pow.Scalar", promoted(BinaryOp::Pow, F)),
        op!("aten::pow.Scalar_out", promoted(BinaryOp::Pow, F)),
        op!("aten::floor_divide", binary(FloorDivide, F)),
        op!("aten::floor_divide.out", binary(FloorDivide, F)),
        op!("aten::floor_divide_.Tensor", binary(FloorDivide, I)),
        op!("aten::floor_divide.Scalar", binary(FloorDivide, F)),
        op!("aten::floor_divide_.Scalar", binary(FloorDivide, I)),
        op!("aten::xlogy.Tensor", binary(Xlogy, F)),
        op!("aten::xlogy.OutTensor", binary(Xlogy, F)),
        op!("aten::xlogy_.Tensor", binary(Xlogy, I)),
        op!("aten::xlogy.Scalar_Other", binary(Xlogy, F)),
        op!("aten::xlogy.Scalar_Self", binary(Xlogy, F)),
        op!("aten::special_xlog1py", binary(Xlog1py, F)),
        op!("aten::special_xlog1py.out", binary(Xlog1py, F)),
        op!("aten::special_xlog1py.self_scalar", binary(Xlog1py, F)),
        op!("aten::special_xlog1py.other_scalar", binary(Xlog1py, F)),
    ];
    ops.extend(tensor_scalar!("aten::add", add_sub(BinaryOp::Add)));
    ops.extend(tensor_scalar!("aten::sub", add_sub(BinaryOp::Sub)));
    ops.extend(tensor_scalar!("aten::mul", promoted(BinaryOp::Mul)));
    ops.extend(tensor_scalar!("aten::div", div(None)));
    ops.extend(overloads!(
        "aten::remainder",
        ["Tensor", "Scalar"],
        binary(Remainder)
    ));
    ops.extend(overloads!("aten::fmod", ["Tensor", "Scalar"], binary(Fmod)));
    ops.extend(overloads!(
        "aten::bitwise_and",
        ["Tensor", "Scalar"],
        binary(BitwiseAnd)
    ));
    ops.extend(overloads!(
        "aten::bitwise_or",
        ["Tensor", "Scalar"],
        binary(BitwiseOr)
    ));
    ops.extend(overloads!(
        "aten::bitwise_xor",
        ["Tensor", "Scalar"],
        binary(BitwiseXor)
    ));
    ops.extend(forms!("aten::atan2", binary(Atan2)));
    ops.extend(forms!("aten::hypot", binary(Hypot)));
    ops.extend(forms!("aten::logical_and", logical_binary(BinaryOp::And)));
    ops.extend(forms!("aten::logical_or", logical_binary(BinaryOp::Or)));
    ops.extend(forms!("aten::logical_xor", logical_binary(BinaryOp::Xor)));
    ops.extend(forms!("aten::heaviside", binary(Heaviside)));
    ops.extend(with_out!("aten::logaddexp", binary(Logaddexp, F)));
    ops.extend(with_out!("aten::logaddexp2", binary(Logaddexp2, F)));
    ops.extend(with_out!("aten::fmax", binary(Fmax, F)));
    ops.extend(with_out!("aten::fmin", binary(Fmin, F)));
    ops.extend([
        op!("aten::copysign.Tensor", binary(Copysign, F)),
        op!("aten::copysign.out", binary(Copysign, F)),
        op!("aten::copysign_.Tensor", binary(Copysign, I)),
        op!("aten::copysign.Scalar", binary(Copysign, F)),
        op!("aten::copysign_.Scalar", binary(Copysign, I)),
    ]);
    ops.extend(forms!("aten::addcmul", addc(false)));
    ops.extend(forms!("aten::addcdiv", addc(true)));
    ops.extend(overloads!("aten::lerp", ["Scalar", "Tensor"], lerp()));
    ops
}
