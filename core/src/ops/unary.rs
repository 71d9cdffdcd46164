//! Unary elementwise ops: float math (and the elementwise hardsigmoid and
//! mish), rounding and sign, relu, negation and absolute value,
//! bitwise/logical not, nan_to_num, logit.

use super::{
    accumulate_dtype, ensure, finish, is_float, is_integral, real_only, Arith, Form, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dtype::{Category, DType};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, UnaryOp, ValueId};

/// Unary float functions; integer and bool inputs compute in float32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unary {
    /// A function StableHLO has as an op.
    Xla(UnaryOp),
    Log2,
    Log10,
    Reciprocal,
    Exp2,
    Sinc,
    Angle,
    Ndtri,
    Entr,
    Hardsigmoid,
    Mish,
}

impl Unary {
    /// Whether the lowering computes complex inputs (in their dtype).
    fn takes_complex(self) -> bool {
        use Unary::*;
        match self {
            // XLA's special functions are defined on reals only.
            Xla(op) => !matches!(
                op,
                UnaryOp::Erf | UnaryOp::Erfc | UnaryOp::ErfInv | UnaryOp::Lgamma | UnaryOp::Digamma
            ),
            Log2 | Log10 | Reciprocal | Exp2 | Angle => true,
            Sinc | Ndtri | Entr | Hardsigmoid | Mish => false,
        }
    }
}

/// tanh(softplus(x)): mish's factor, and its backward's.
pub(super) fn tanh_softplus(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    let e = b.unary(UnaryOp::Exp, x);
    let sp = b.unary(UnaryOp::Log1p, e);
    // softplus(x) = x for large x (exp overflows).
    let large = b.float_like(20.0, x);
    let big = b.compare(CompareDir::Gt, x, large)?;
    let sp = b.select(big, x, sp)?;
    Ok(b.unary(UnaryOp::Tanh, sp))
}

/// `f(x)` for a float `x`.
fn apply(b: &mut Builder, f: Unary, x: ValueId) -> Result<ValueId> {
    match f {
        Unary::Xla(op) => Ok(b.unary(op, x)),
        composite => {
            let (dtype, dims) = (b.dtype(x), b.dims(x));
            composite_unary(b, composite, x, dtype, &dims)
        }
    }
}

/// The functions that are formulas over IR ops.
fn composite_unary(
    b: &mut Builder,
    f: Unary,
    x: ValueId,
    dtype: DType,
    dims: &[i64],
) -> Result<ValueId> {
    Ok(match f {
        Unary::Log2 | Unary::Log10 => {
            let ln = b.unary(UnaryOp::Log, x);
            let base_ln = if f == Unary::Log2 {
                std::f64::consts::LN_2
            } else {
                std::f64::consts::LN_10
            };
            let c = b.constant(Literal::Float(1.0 / base_ln), dtype, dims);
            b.mul(ln, c)?
        }
        Unary::Reciprocal => {
            let one = b.constant(Literal::Int(1), dtype, dims);
            b.div(one, x)?
        }
        Unary::Exp2 => {
            let ln2 = b.float_like(std::f64::consts::LN_2, x);
            let s = b.mul(x, ln2)?;
            b.unary(UnaryOp::Exp, s)
        }
        Unary::Sinc => {
            let pi = b.float_like(std::f64::consts::PI, x);
            let px = b.mul(x, pi)?;
            let s = b.unary(UnaryOp::Sin, px);
            let q = b.div(s, px)?;
            let zero = b.float_like(0.0, x);
            let at_zero = b.compare(CompareDir::Eq, x, zero)?;
            let one = b.float_like(1.0, x);
            b.select(at_zero, one, q)?
        }
        Unary::Angle => {
            let zero = b.float_like(0.0, x);
            let negative = b.compare(CompareDir::Lt, x, zero)?;
            let pi = b.float_like(std::f64::consts::PI, x);
            let a = b.select(negative, pi, zero)?;
            let nan = b.is_nan(x)?;
            b.select(nan, x, a)?
        }
        Unary::Ndtri => {
            let two = b.float_like(2.0, x);
            let t = b.mul(x, two)?;
            let one = b.float_like(1.0, x);
            let t = b.sub(t, one)?;
            let e = b.unary(UnaryOp::ErfInv, t);
            let sqrt2 = b.float_like(std::f64::consts::SQRT_2, e);
            b.mul(e, sqrt2)?
        }
        Unary::Entr => {
            let l = b.unary(UnaryOp::Log, x);
            let v = b.mul(x, l)?;
            let v = b.unary(UnaryOp::Neg, v);
            let zero = b.float_like(0.0, x);
            let is_zero = b.compare(CompareDir::Eq, x, zero)?;
            let negative = b.compare(CompareDir::Lt, x, zero)?;
            let v = b.select(is_zero, zero, v)?;
            let neg_inf = b.float_like(f64::NEG_INFINITY, x);
            b.select(negative, neg_inf, v)?
        }
        Unary::Hardsigmoid => {
            let three = b.float_like(3.0, x);
            let t = b.add(x, three)?;
            let zero = b.float_like(0.0, x);
            let t = b.maximum(t, zero)?;
            let six = b.float_like(6.0, x);
            let t = b.minimum(t, six)?;
            let six = b.float_like(6.0, x);
            b.div(t, six)?
        }
        Unary::Mish => {
            let t = tanh_softplus(b, x)?;
            b.mul(x, t)?
        }
        Unary::Xla(op) => b.unary(op, x),
    })
}

fn float_unary(b: &mut Builder, f: Unary, form: Form) -> Result<()> {
    let input = b.tensor_arg(0)?.view.dtype;
    if input.category() == Category::Complex {
        if !f.takes_complex() {
            return Err(Error::NotLowered {
                op: b.op_name().to_string(),
                what: format!("{input} inputs"),
            });
        }
        let x = b.tensor(0)?;
        let out = if f == Unary::Angle {
            // The argument of x, in its component dtype.
            let re = b.complex_part(x, false);
            let im = b.complex_part(x, true);
            b.binary(BinaryOp::Atan2, im, re)?
        } else {
            apply(b, f, x)?
        };
        return finish(b, form, out);
    }
    let dtype = if is_float(input) { input } else { DType::F32 };
    // 16-bit floats compute in float32 and round once, as ATen's CPU
    // kernels do: XLA's own float16 and bfloat16 forms (erf, sigmoid, log2,
    // ...) round in between and land up to thousands of ulps off.
    let x = b.tensor(0)?;
    let x = b.convert(x, accumulate_dtype(dtype));
    let out = apply(b, f, x)?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// Rounding and sign ops, which keep the dtype (identity on integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rounding {
    Floor,
    Ceil,
    Round,
    Trunc,
    Frac,
    Sign,
    /// sgn: sign, and x / |x| for a complex x.
    Sgn,
}

fn rounding(b: &mut Builder, kind: Rounding, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let dtype = b.dtype(x);
    if kind != Rounding::Sgn {
        real_only(b, dtype)?;
    }
    let out = if !is_float(dtype) {
        match kind {
            Rounding::Sign | Rounding::Sgn if dtype == DType::Bool => x,
            // stablehlo.sign of a complex is x / |x| (0 at 0).
            Rounding::Sign | Rounding::Sgn => b.unary(UnaryOp::Sign, x),
            Rounding::Frac => {
                return Err(Error::invalid(
                    format!("{}: input", b.op_name()),
                    "a floating point tensor",
                    dtype,
                ))
            }
            _ => x,
        }
    } else {
        match kind {
            Rounding::Floor => b.unary(UnaryOp::Floor, x),
            Rounding::Ceil => b.unary(UnaryOp::Ceil, x),
            Rounding::Round => b.unary(UnaryOp::RoundNearestEven, x),
            Rounding::Sign | Rounding::Sgn => sign(b, x)?,
            Rounding::Trunc | Rounding::Frac => {
                let t = trunc(b, x)?;
                if kind == Rounding::Frac {
                    b.sub(x, t)?
                } else {
                    t
                }
            }
        }
    };
    finish(b, form, out)
}

/// torch.sign of a float: (x > 0) - (x < 0), so NaN and -0.0 give +0.0
/// (stablehlo.sign keeps both).
fn sign(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    let zero = b.float_like(0.0, x);
    let positive = b.compare(CompareDir::Gt, x, zero)?;
    let negative = b.compare(CompareDir::Lt, x, zero)?;
    let one = b.float_like(1.0, x);
    let minus_one = b.float_like(-1.0, x);
    let out = b.select(negative, minus_one, zero)?;
    b.select(positive, one, out)
}

/// trunc(x) = sign(x) * floor(|x|), for floats.
pub(super) fn trunc(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    let a = b.unary(UnaryOp::Abs, x);
    let f = b.unary(UnaryOp::Floor, a);
    let s = b.unary(UnaryOp::Sign, x);
    b.mul(s, f)
}

/// Unary ops that keep the input dtype.
fn same_unary(
    b: &mut Builder,
    f: fn(&mut Builder, ValueId) -> Result<ValueId>,
    form: Form,
) -> Result<()> {
    let x = b.tensor(0)?;
    let out = f(b, x)?;
    finish(b, form, out)
}

/// Errors for a bool `x`, which the op cannot take (`expected` says what
/// it can).
fn reject_bool(b: &Builder, x: ValueId, expected: &str) -> Result<()> {
    ensure(b, b.dtype(x) != DType::Bool, "input", expected, "bool")
}

fn relu(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    reject_bool(b, x, "a numeric tensor")?;
    let zero = b.constant(Literal::Int(0), b.dtype(x), &b.dims(x));
    b.maximum(x, zero)
}

fn neg(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    reject_bool(b, x, "a numeric tensor (use ~ or logical_not for bools)")?;
    Ok(b.unary(UnaryOp::Neg, x))
}

fn abs(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    if b.dtype(x) == DType::Bool
        || matches!(b.dtype(x), DType::U8 | DType::U16 | DType::U32 | DType::U64)
    {
        return Ok(x);
    }
    Ok(b.unary(UnaryOp::Abs, x))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Negation {
    /// bitwise_not: integers and bool.
    Bitwise,
    /// logical_not: to bool.
    Logical,
}

fn not(b: &mut Builder, kind: Negation, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let dtype = b.dtype(x);
    let out = if kind == Negation::Logical {
        let as_bool = b.convert(x, DType::Bool);
        let n = b.unary(UnaryOp::Not, as_bool);
        if form == Form::InPlace {
            b.convert(n, dtype)
        } else {
            n
        }
    } else {
        if !is_integral(dtype, true) {
            return Err(Error::invalid(
                format!("{}: input", b.op_name()),
                "an integer or bool tensor",
                dtype,
            ));
        }
        b.unary(UnaryOp::Not, x)
    };
    finish(b, form, out)
}

/// nan_to_num(self, nan?, posinf?, neginf?).
fn nan_to_num(b: &mut Builder, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let (dtype, dims) = (b.dtype(x), b.dims(x));
    if !is_float(dtype) {
        return finish(b, form, x);
    }
    let (max, min) = match dtype {
        DType::F16 => (65504.0, -65504.0),
        DType::BF16 => (3.389_531_389_251_535_5e38, -3.389_531_389_251_535_5e38),
        DType::F32 => (f32::MAX as f64, f32::MIN as f64),
        _ => (f64::MAX, f64::MIN),
    };
    let value = |b: &mut Builder, index: usize, default: f64| -> Result<ValueId> {
        let v = match b.arg(index) {
            Ok(Arg::None) | Err(_) => b.scalar_input(Literal::Float(default), dtype),
            Ok(_) => b.scalar_arg(index, dtype)?,
        };
        b.broadcast_to(v, &dims)
    };
    let (nan_v, pos_v, neg_v) = (value(b, 1, 0.0)?, value(b, 2, max)?, value(b, 3, min)?);
    let inf = b.float_like(f64::INFINITY, x);
    let ninf = b.float_like(f64::NEG_INFINITY, x);
    let nan = b.is_nan(x)?;
    let pos = b.compare(CompareDir::Eq, x, inf)?;
    let neg = b.compare(CompareDir::Eq, x, ninf)?;
    let out = b.select(nan, nan_v, x)?;
    let out = b.select(pos, pos_v, out)?;
    let out = b.select(neg, neg_v, out)?;
    finish(b, form, out)
}

/// logit(self, eps?) = log(z / (1 - z)), z = clamp(self, eps, 1 - eps).
fn logit(b: &mut Builder, form: Form) -> Result<()> {
    let input = b.tensor_arg(0)?.view.dtype;
    let dtype = if is_float(input) { input } else { DType::F32 };
    let x = b.tensor(0)?;
    let x = b.convert(x, accumulate_dtype(dtype));
    let z = match b.arg(1) {
        Ok(Arg::None) | Err(_) => x,
        Ok(_) => {
            let eps = b.float_arg(1)?;
            let lo = b.float_like(eps, x);
            let hi = b.float_like(1.0 - eps, x);
            let z = b.maximum(x, lo)?;
            b.minimum(z, hi)?
        }
    };
    let one = b.float_like(1.0, z);
    let omz = b.sub(one, z)?;
    let r = b.div(z, omz)?;
    let out = b.unary(UnaryOp::Log, r);
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// round.decimals(self, *, decimals), with ATen's scaling by 10^|d|.
fn round_decimals(b: &mut Builder, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let decimals = b.int_arg(1)?;
    let dtype = b.dtype(x);
    if !is_float(dtype) {
        return finish(b, form, x);
    }
    let acc = accumulate_dtype(dtype);
    let x = b.convert(x, acc);
    let p = b.float_like(10f64.powi(decimals.unsigned_abs() as i32), x);
    let out = if decimals >= 0 {
        let s = b.mul(x, p)?;
        let r = b.unary(UnaryOp::RoundNearestEven, s);
        b.div(r, p)?
    } else {
        let s = b.div(x, p)?;
        let r = b.unary(UnaryOp::RoundNearestEven, s);
        b.mul(r, p)?
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::Functional as F;
    use Unary::*;
    use UnaryOp::*;
    let mut ops = vec![
        op!("aten::relu", same_unary(relu, F)),
        op!("aten::relu_", same_unary(relu, Form::InPlace)),
    ];
    ops.extend(forms!("aten::exp", float_unary(Xla(Exp))));
    ops.extend(forms!("aten::log", float_unary(Xla(Log))));
    ops.extend(forms!("aten::sqrt", float_unary(Xla(Sqrt))));
    ops.extend(forms!("aten::rsqrt", float_unary(Xla(Rsqrt))));
    ops.extend(forms!("aten::tanh", float_unary(Xla(Tanh))));
    ops.extend(forms!("aten::sigmoid", float_unary(Xla(Logistic))));
    ops.extend(forms!("aten::erf", float_unary(Xla(Erf))));
    ops.extend(forms!("aten::erfc", float_unary(Xla(Erfc))));
    ops.extend(forms!("aten::erfinv", float_unary(Xla(ErfInv))));
    ops.extend(forms!("aten::lgamma", float_unary(Xla(Lgamma))));
    ops.extend(forms!("aten::digamma", float_unary(Xla(Digamma))));
    ops.extend(forms!("aten::log1p", float_unary(Xla(Log1p))));
    ops.extend(forms!("aten::expm1", float_unary(Xla(Expm1))));
    ops.extend(forms!("aten::sin", float_unary(Xla(Sin))));
    ops.extend(forms!("aten::cos", float_unary(Xla(Cos))));
    ops.extend(forms!("aten::tan", float_unary(Xla(Tan))));
    ops.extend(forms!("aten::atan", float_unary(Xla(Atan))));
    ops.extend(forms!("aten::asin", float_unary(Xla(Asin))));
    ops.extend(forms!("aten::acos", float_unary(Xla(Acos))));
    ops.extend(forms!("aten::sinh", float_unary(Xla(Sinh))));
    ops.extend(forms!("aten::cosh", float_unary(Xla(Cosh))));
    ops.extend(forms!("aten::asinh", float_unary(Xla(Asinh))));
    ops.extend(forms!("aten::acosh", float_unary(Xla(Acosh))));
    ops.extend(forms!("aten::atanh", float_unary(Xla(Atanh))));
    ops.extend(forms!("aten::log2", float_unary(Log2)));
    ops.extend(forms!("aten::log10", float_unary(Log10)));
    ops.extend(forms!("aten::reciprocal", float_unary(Reciprocal)));
    ops.extend(forms!("aten::exp2", float_unary(Exp2)));
    ops.extend(forms!("aten::sinc", float_unary(Sinc)));
    ops.extend(forms!("aten::hardsigmoid", float_unary(Hardsigmoid)));
    ops.extend(forms!("aten::mish", float_unary(Mish)));
    ops.extend(with_out!("aten::angle", float_unary(Angle, F)));
    ops.extend(with_out!("aten::special_ndtri", float_unary(Ndtri, F)));
    ops.extend(with_out!("aten::special_entr", float_unary(Entr, F)));
    ops.extend(forms!("aten::floor", rounding(Rounding::Floor)));
    ops.extend(forms!("aten::ceil", rounding(Rounding::Ceil)));
    ops.extend(forms!("aten::round", rounding(Rounding::Round)));
    ops.extend(forms!("aten::trunc", rounding(Rounding::Trunc)));
    ops.extend(forms!("aten::frac", rounding(Rounding::Frac)));
    ops.extend(forms!("aten::sign", rounding(Rounding::Sign)));
    ops.extend(forms!("aten::sgn", rounding(Rounding::Sgn)));
    ops.extend(overloads!("aten::round", ["decimals"], round_decimals()));
    ops.extend(forms!("aten::neg", same_unary(neg)));
    ops.extend(forms!("aten::abs", same_unary(abs)));
    ops.extend(forms!("aten::bitwise_not", not(Negation::Bitwise)));
    ops.extend(forms!("aten::logical_not", not(Negation::Logical)));
    ops.extend(forms!("aten::nan_to_num", nan_to_num()));
    ops.extend(forms!("aten::logit", logit()));
    ops
}
