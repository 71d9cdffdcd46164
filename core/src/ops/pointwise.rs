//! Elementwise ops: arithmetic, unary math, comparisons, selection, fills
//! and copies, each in functional, in-place and `.out` form.

use super::{broadcast_all, finish, is_float, is_integral, op, operand, result_type, Form, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, UnaryOp, ValueId};

/// `self op (alpha * other)` for add/sub with an optional `alpha` at `alpha_index`.
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
        y = b.binary(BinaryOp::Mul, y, alpha)?;
    }
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let out = b.binary(op, x, y)?;
    finish(b, form, out)
}

fn mul(b: &mut Builder, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let out = b.binary(BinaryOp::Mul, x, y)?;
    finish(b, form, out)
}

/// True division (integers promote to float32), or with a rounding mode
/// (`"trunc"`/`"floor"`) at `mode_index`.
fn div(b: &mut Builder, form: Form, mode_index: Option<usize>) -> Result<()> {
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
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    // Rounding modes see the float32 quotient of 16-bit inputs, as in ATen.
    let acc = super::reduce::accumulate_dtype(dtype);
    let (x, y) = (b.convert(x, acc), b.convert(y, acc));
    let q = b.binary(BinaryOp::Div, x, y)?;
    let out = match mode.as_deref() {
        None => q,
        Some("trunc") if is_float(dtype) => {
            // trunc(q) = sign(q) * floor(|q|)
            let a = b.unary(UnaryOp::Abs, q);
            let f = b.unary(UnaryOp::Floor, a);
            let s = b.unary(UnaryOp::Sign, q);
            b.binary(BinaryOp::Mul, s, f)?
        }
        Some("floor") if is_float(dtype) => b.unary(UnaryOp::Floor, q),
        // Integer division truncates; floor subtracts one where the signs
        // differ and the division is inexact.
        Some("floor") => {
            let dims = b.dims(q);
            let r = b.binary(BinaryOp::Rem, x, y)?;
            let zero = b.constant(Literal::Int(0), dtype, &dims);
            let inexact = b.compare(CompareDir::Ne, r, zero)?;
            let xn = b.compare(CompareDir::Lt, x, zero)?;
            let yn = b.compare(CompareDir::Lt, y, zero)?;
            let differ = b.binary(BinaryOp::Xor, xn, yn)?;
            let adjust = b.binary(BinaryOp::And, inexact, differ)?;
            let one = b.constant(Literal::Int(1), dtype, &dims);
            let q1 = b.binary(BinaryOp::Sub, q, one)?;
            b.select(adjust, q1, q)?
        }
        _ => q,
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// Unary float math: integer and bool inputs compute in float32.
fn float_unary(
    b: &mut Builder,
    form: Form,
    f: fn(&mut Builder, ValueId) -> Result<ValueId>,
) -> Result<()> {
    let input = b.tensor_arg(0)?.view.dtype;
    let dtype = if is_float(input) || matches!(input, DType::C64 | DType::C128) {
        input
    } else {
        DType::F32
    };
    let x = b.tensor(0)?;
    let x = b.convert(x, dtype);
    let out = f(b, x)?;
    finish(b, form, out)
}

/// Unary ops that keep the input dtype.
fn same_unary(
    b: &mut Builder,
    form: Form,
    f: fn(&mut Builder, ValueId) -> Result<ValueId>,
) -> Result<()> {
    let x = b.tensor(0)?;
    let out = f(b, x)?;
    finish(b, form, out)
}

fn relu(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    if b.dtype(x) == DType::Bool {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a numeric tensor",
            "bool",
        ));
    }
    let zero = b.constant(Literal::Int(0), b.dtype(x), &b.dims(x));
    b.binary(BinaryOp::Max, x, zero)
}

fn neg(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    if b.dtype(x) == DType::Bool {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a numeric tensor (use ~ or logical_not for bools)",
            "bool",
        ));
    }
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

fn pow(b: &mut Builder, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let out = b.binary(BinaryOp::Pow, x, y)?;
    finish(b, form, out)
}

fn compare(b: &mut Builder, dir: CompareDir) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let out = b.compare(dir, x, y)?;
    b.output(out)
}

fn min_max(b: &mut Builder, op: BinaryOp) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let out = b.binary(op, x, y)?;
    b.output(out)
}

/// clamp(self, min, max) with Scalar or Tensor bounds, either optional.
fn clamp(
    b: &mut Builder,
    form: Form,
    min_index: Option<usize>,
    max_index: Option<usize>,
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
    if let Some(i) = lo {
        let m = operand(b, i, dtype)?;
        let [xb, mb] = broadcast_all(b, &[x, m])?[..] else {
            unreachable!("two values in, two out")
        };
        x = b.binary(BinaryOp::Max, xb, mb)?;
    }
    if let Some(i) = hi {
        let m = operand(b, i, dtype)?;
        let [xb, mb] = broadcast_all(b, &[x, m])?[..] else {
            unreachable!("two values in, two out")
        };
        x = b.binary(BinaryOp::Min, xb, mb)?;
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

/// grad where self > threshold, else 0 (relu's backward).
fn threshold_backward(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let g = operand(b, 0, dtype)?;
    let x = operand(b, 1, dtype)?;
    let [g, x] = broadcast_all(b, &[g, x])?[..] else {
        unreachable!("two values in, two out")
    };
    let dims = b.dims(x);
    let t = b.scalar_arg(2, dtype)?;
    let t = b.broadcast_to(t, &dims)?;
    let keep = b.compare(CompareDir::Gt, x, t)?;
    let zero = b.constant(Literal::Int(0), dtype, &dims);
    let out = b.select(keep, g, zero)?;
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

/// `self + value * t1 * t2` (addcmul) or `self + value * t1 / t2` (addcdiv).
fn addc(b: &mut Builder, form: Form, divide: bool) -> Result<()> {
    let dtype = result_type(b, &[0, 1, 2])?;
    if divide && is_integral(dtype, true) {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "floating-point tensors",
            dtype,
        ));
    }
    let x = operand(b, 0, dtype)?;
    let t1 = operand(b, 1, dtype)?;
    let t2 = operand(b, 2, dtype)?;
    let [x, t1, t2] = broadcast_all(b, &[x, t1, t2])?[..] else {
        unreachable!("three values in, three out")
    };
    // One rounding for 16-bit floats: compute in float32, as ATen does.
    let acc = super::reduce::accumulate_dtype(dtype);
    let (x, t1, t2) = (b.convert(x, acc), b.convert(t1, acc), b.convert(t2, acc));
    let prod = b.binary(if divide { BinaryOp::Div } else { BinaryOp::Mul }, t1, t2)?;
    let scaled = if b.num_args() > 3 && !matches!(b.arg(3)?, Arg::Int(1)) {
        let v = b.scalar_arg(3, acc)?;
        let v = b.broadcast_to(v, &b.dims(prod))?;
        b.binary(BinaryOp::Mul, prod, v)?
    } else {
        prod
    };
    let out = b.binary(BinaryOp::Add, x, scaled)?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// lerp(self, end, weight) = self + weight * (end - self).
fn lerp(b: &mut Builder, form: Form) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let e = operand(b, 1, dtype)?;
    let w = operand(b, 2, dtype)?;
    let [x, e, w] = broadcast_all(b, &[x, e, w])?[..] else {
        unreachable!("three values in, three out")
    };
    // ATen's two-sided formula in float32 for 16-bit inputs: from self for
    // weight < 0.5, from end otherwise (exact at both ends).
    let acc = super::reduce::accumulate_dtype(dtype);
    let (x, e, w) = (b.convert(x, acc), b.convert(e, acc), b.convert(w, acc));
    let dims = b.dims(x);
    let d = b.binary(BinaryOp::Sub, e, x)?;
    let s = b.binary(BinaryOp::Mul, w, d)?;
    let near_self = b.binary(BinaryOp::Add, x, s)?;
    let one = b.constant(Literal::Int(1), acc, &dims);
    let omw = b.binary(BinaryOp::Sub, one, w)?;
    let t = b.binary(BinaryOp::Mul, d, omw)?;
    let near_end = b.binary(BinaryOp::Sub, e, t)?;
    let half = b.constant(Literal::Float(0.5), acc, &dims);
    let small = b.compare(CompareDir::Lt, w, half)?;
    let out = b.select(small, near_self, near_end)?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

fn sigmoid(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    Ok(b.unary(UnaryOp::Logistic, x))
}

macro_rules! unary_fn {
    ($name:ident, $op:expr) => {
        fn $name(b: &mut Builder, x: ValueId) -> Result<ValueId> {
            Ok(b.unary($op, x))
        }
    };
}
unary_fn!(exp, UnaryOp::Exp);
unary_fn!(log, UnaryOp::Log);
unary_fn!(sqrt, UnaryOp::Sqrt);
unary_fn!(rsqrt, UnaryOp::Rsqrt);
unary_fn!(tanh, UnaryOp::Tanh);

pub(super) fn ops() -> Vec<OpDef> {
    use Form::{Functional as F, InPlace as I};
    let mut ops = vec![
        op("aten::add.Tensor", |b| add_sub(b, BinaryOp::Add, F)),
        op("aten::add.out", |b| add_sub(b, BinaryOp::Add, F)),
        op("aten::add_.Tensor", |b| add_sub(b, BinaryOp::Add, I)),
        op("aten::add.Scalar", |b| add_sub(b, BinaryOp::Add, F)),
        op("aten::add_.Scalar", |b| add_sub(b, BinaryOp::Add, I)),
        op("aten::sub.Tensor", |b| add_sub(b, BinaryOp::Sub, F)),
        op("aten::sub.out", |b| add_sub(b, BinaryOp::Sub, F)),
        op("aten::sub_.Tensor", |b| add_sub(b, BinaryOp::Sub, I)),
        op("aten::sub.Scalar", |b| add_sub(b, BinaryOp::Sub, F)),
        op("aten::sub_.Scalar", |b| add_sub(b, BinaryOp::Sub, I)),
        op("aten::mul.Tensor", |b| mul(b, F)),
        op("aten::mul.out", |b| mul(b, F)),
        op("aten::mul_.Tensor", |b| mul(b, I)),
        op("aten::mul.Scalar", |b| mul(b, F)),
        op("aten::mul_.Scalar", |b| mul(b, I)),
        op("aten::div.Tensor", |b| div(b, F, None)),
        op("aten::div.out", |b| div(b, F, None)),
        op("aten::div_.Tensor", |b| div(b, I, None)),
        op("aten::div.Scalar", |b| div(b, F, None)),
        op("aten::div_.Scalar", |b| div(b, I, None)),
        op("aten::div.Tensor_mode", |b| div(b, F, Some(2))),
        op("aten::div.out_mode", |b| div(b, F, Some(2))),
        op("aten::div_.Tensor_mode", |b| div(b, I, Some(2))),
        op("aten::div.Scalar_mode", |b| div(b, F, Some(2))),
        op("aten::div_.Scalar_mode", |b| div(b, I, Some(2))),
        op("aten::pow.Tensor_Scalar", |b| pow(b, F)),
        op("aten::pow.Tensor_Scalar_out", |b| pow(b, F)),
        op("aten::pow_.Scalar", |b| pow(b, I)),
        op("aten::pow.Tensor_Tensor", |b| pow(b, F)),
        op("aten::pow.Tensor_Tensor_out", |b| pow(b, F)),
        op("aten::pow_.Tensor", |b| pow(b, I)),
        op("aten::pow.Scalar", |b| pow(b, F)),
        op("aten::pow.Scalar_out", |b| pow(b, F)),
        op("aten::maximum", |b| min_max(b, BinaryOp::Max)),
        op("aten::maximum.out", |b| min_max(b, BinaryOp::Max)),
        op("aten::minimum", |b| min_max(b, BinaryOp::Min)),
        op("aten::minimum.out", |b| min_max(b, BinaryOp::Min)),
        op("aten::clamp", |b| clamp(b, F, Some(1), Some(2))),
        op("aten::clamp.out", |b| clamp(b, F, Some(1), Some(2))),
        op("aten::clamp_", |b| clamp(b, I, Some(1), Some(2))),
        op("aten::clamp.Tensor", |b| clamp(b, F, Some(1), Some(2))),
        op("aten::clamp_.Tensor", |b| clamp(b, I, Some(1), Some(2))),
        op("aten::clamp.Tensor_out", |b| clamp(b, F, Some(1), Some(2))),
        op("aten::clamp_min", |b| clamp(b, F, Some(1), None)),
        op("aten::clamp_min.out", |b| clamp(b, F, Some(1), None)),
        op("aten::clamp_min.Tensor", |b| clamp(b, F, Some(1), None)),
        op("aten::clamp_min.Tensor_out", |b| clamp(b, F, Some(1), None)),
        op("aten::clamp_min_.Tensor", |b| clamp(b, I, Some(1), None)),
        op("aten::clamp_max.Tensor", |b| clamp(b, F, None, Some(1))),
        op("aten::clamp_max.Tensor_out", |b| clamp(b, F, None, Some(1))),
        op("aten::clamp_max_.Tensor", |b| clamp(b, I, None, Some(1))),
        op("aten::clamp_max.out", |b| clamp(b, F, None, Some(1))),
        op("aten::clamp_min_", |b| clamp(b, I, Some(1), None)),
        op("aten::clamp_max", |b| clamp(b, F, None, Some(1))),
        op("aten::clamp_max_", |b| clamp(b, I, None, Some(1))),
        op("aten::where.self", where_self),
        op("aten::where.self_out", where_self),
        op("aten::threshold_backward", threshold_backward),
        op("aten::threshold_backward.grad_input", threshold_backward),
        op("aten::fill_.Scalar", fill_scalar),
        op("aten::fill_.Tensor", fill_scalar),
        op("aten::zero_", zero),
        op("aten::copy_", copy),
        op("aten::addcmul", |b| addc(b, F, false)),
        op("aten::addcmul.out", |b| addc(b, F, false)),
        op("aten::addcdiv.out", |b| addc(b, F, true)),
        op("aten::lerp.Scalar_out", |b| lerp(b, F)),
        op("aten::lerp.Tensor_out", |b| lerp(b, F)),
        op("aten::addcmul_", |b| addc(b, I, false)),
        op("aten::addcdiv", |b| addc(b, F, true)),
        op("aten::addcdiv_", |b| addc(b, I, true)),
        op("aten::lerp.Scalar", |b| lerp(b, F)),
        op("aten::lerp_.Scalar", |b| lerp(b, I)),
        op("aten::lerp.Tensor", |b| lerp(b, F)),
        op("aten::lerp_.Tensor", |b| lerp(b, I)),
        op("aten::relu", |b| same_unary(b, F, relu)),
        op("aten::relu_", |b| same_unary(b, I, relu)),
        op("aten::neg", |b| same_unary(b, F, neg)),
        op("aten::neg.out", |b| same_unary(b, F, neg)),
        op("aten::neg_", |b| same_unary(b, I, neg)),
        op("aten::abs", |b| same_unary(b, F, abs)),
        op("aten::abs.out", |b| same_unary(b, F, abs)),
        op("aten::abs_", |b| same_unary(b, I, abs)),
    ];
    for (dir, names) in [
        (
            CompareDir::Eq,
            [
                "aten::eq.Tensor",
                "aten::eq.Scalar",
                "aten::eq.Tensor_out",
                "aten::eq.Scalar_out",
            ],
        ),
        (
            CompareDir::Ne,
            [
                "aten::ne.Tensor",
                "aten::ne.Scalar",
                "aten::ne.Tensor_out",
                "aten::ne.Scalar_out",
            ],
        ),
        (
            CompareDir::Lt,
            [
                "aten::lt.Tensor",
                "aten::lt.Scalar",
                "aten::lt.Tensor_out",
                "aten::lt.Scalar_out",
            ],
        ),
        (
            CompareDir::Le,
            [
                "aten::le.Tensor",
                "aten::le.Scalar",
                "aten::le.Tensor_out",
                "aten::le.Scalar_out",
            ],
        ),
        (
            CompareDir::Gt,
            [
                "aten::gt.Tensor",
                "aten::gt.Scalar",
                "aten::gt.Tensor_out",
                "aten::gt.Scalar_out",
            ],
        ),
        (
            CompareDir::Ge,
            [
                "aten::ge.Tensor",
                "aten::ge.Scalar",
                "aten::ge.Tensor_out",
                "aten::ge.Scalar_out",
            ],
        ),
    ] {
        let lower: fn(&mut Builder) -> Result<()> = match dir {
            CompareDir::Eq => |b| compare(b, CompareDir::Eq),
            CompareDir::Ne => |b| compare(b, CompareDir::Ne),
            CompareDir::Lt => |b| compare(b, CompareDir::Lt),
            CompareDir::Le => |b| compare(b, CompareDir::Le),
            CompareDir::Gt => |b| compare(b, CompareDir::Gt),
            CompareDir::Ge => |b| compare(b, CompareDir::Ge),
        };
        for name in names {
            ops.push(op(name, lower));
        }
    }
    // Float unary ops in all three forms; each finds its math by name,
    // since table entries are plain fn pointers.
    for base in ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid"] {
        let names: [&'static str; 3] = match base {
            "exp" => ["aten::exp", "aten::exp.out", "aten::exp_"],
            "log" => ["aten::log", "aten::log.out", "aten::log_"],
            "sqrt" => ["aten::sqrt", "aten::sqrt.out", "aten::sqrt_"],
            "rsqrt" => ["aten::rsqrt", "aten::rsqrt.out", "aten::rsqrt_"],
            "tanh" => ["aten::tanh", "aten::tanh.out", "aten::tanh_"],
            _ => ["aten::sigmoid", "aten::sigmoid.out", "aten::sigmoid_"],
        };
        ops.push(op(names[0], |b| {
            float_unary(b, Form::Functional, unary_for(b.op_name()))
        }));
        ops.push(op(names[1], |b| {
            float_unary(b, Form::Functional, unary_for(b.op_name()))
        }));
        ops.push(op(names[2], |b| {
            float_unary(b, Form::InPlace, unary_for(b.op_name()))
        }));
    }
    ops
}

/// The lowering of a float unary op by schema name.
fn unary_for(name: &str) -> fn(&mut Builder, ValueId) -> Result<ValueId> {
    let base = name
        .trim_start_matches("aten::")
        .trim_end_matches(".out")
        .trim_end_matches('_');
    match base {
        "exp" => exp,
        "log" => log,
        "sqrt" => sqrt,
        "rsqrt" => rsqrt,
        "tanh" => tanh,
        _ => sigmoid,
    }
}
