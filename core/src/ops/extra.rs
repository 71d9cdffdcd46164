//! The long tail that models and the OpInfo database use: vector and
//! batched products, more elementwise functions and activations, small
//! losses, and index_add/copy/fill and take.

use super::reduce::accumulate_dtype;
use super::{broadcast_all, finish, is_float, op, operand, result_type, wrap_dim, Form, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

/// Binary elementwise helper: operands promoted (integers to float32 when
/// `float`), broadcast, and computed in float32 for 16-bit inputs.
fn binary_operands(b: &mut Builder, float: bool) -> Result<(ValueId, ValueId, DType)> {
    let promoted = result_type(b, &[0, 1])?;
    let dtype = if float && !is_float(promoted) {
        DType::F32
    } else {
        promoted
    };
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let acc = accumulate_dtype(dtype);
    Ok((b.convert(x, acc), b.convert(y, acc), dtype))
}

fn c(b: &mut Builder, v: f64, like: ValueId) -> ValueId {
    let (dtype, dims) = (b.dtype(like), b.dims(like));
    b.constant(Literal::Float(v), dtype, &dims)
}

fn add(b: &mut Builder, x: ValueId, y: ValueId) -> Result<ValueId> {
    b.binary(BinaryOp::Add, x, y)
}
fn sub(b: &mut Builder, x: ValueId, y: ValueId) -> Result<ValueId> {
    b.binary(BinaryOp::Sub, x, y)
}
fn mul(b: &mut Builder, x: ValueId, y: ValueId) -> Result<ValueId> {
    b.binary(BinaryOp::Mul, x, y)
}
fn div(b: &mut Builder, x: ValueId, y: ValueId) -> Result<ValueId> {
    b.binary(BinaryOp::Div, x, y)
}
fn is_nan(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    b.compare(CompareDir::Ne, x, x)
}

/// The binary functions of this module, by base name.
fn binary_fn(b: &mut Builder) -> Result<()> {
    let name = b
        .op_name()
        .trim_start_matches("aten::")
        .split('.')
        .next()
        .unwrap_or("")
        .to_string();
    let form = if name.ends_with('_') {
        Form::InPlace
    } else {
        Form::Functional
    };
    let base = name.trim_end_matches('_').trim_start_matches("special_");
    let float = matches!(
        base,
        "xlogy" | "xlog1py" | "logaddexp" | "logaddexp2" | "copysign"
    );
    let (x, y, dtype) = binary_operands(b, float)?;
    let out = match base {
        "xlogy" | "xlog1py" => {
            let l = b.unary(
                if base == "xlogy" {
                    UnaryOp::Log
                } else {
                    UnaryOp::Log1p
                },
                y,
            );
            let p = mul(b, x, l)?;
            let zero = c(b, 0.0, x);
            let x_zero = b.compare(CompareDir::Eq, x, zero)?;
            let y_nan = is_nan(b, y)?;
            let not_nan = b.unary(UnaryOp::Not, y_nan);
            let use_zero = b.binary(BinaryOp::And, x_zero, not_nan)?;
            b.select(use_zero, zero, p)?
        }
        "logaddexp" | "logaddexp2" => {
            // max + log(1 + base^-(|a - b|)), exact when both are the same inf.
            let ln_base = if base == "logaddexp" {
                1.0
            } else {
                std::f64::consts::LN_2
            };
            let m = b.binary(BinaryOp::Max, x, y)?;
            let d = sub(b, x, y)?;
            let d = b.unary(UnaryOp::Abs, d);
            let k = c(b, -ln_base, d);
            let scaled = mul(b, d, k)?;
            let e = b.unary(UnaryOp::Exp, scaled);
            let l = b.unary(UnaryOp::Log1p, e);
            let k = c(b, 1.0 / ln_base, l);
            let l = mul(b, l, k)?;
            // Equal inputs (both infinite too) give x + log_base(2).
            let same = b.compare(CompareDir::Eq, x, y)?;
            let sum = add(b, m, l)?;
            let ln2 = c(b, std::f64::consts::LN_2 / ln_base, x);
            let doubled = add(b, x, ln2)?;
            b.select(same, doubled, sum)?
        }
        "copysign" => {
            let a = b.unary(UnaryOp::Abs, x);
            let na = b.unary(UnaryOp::Neg, a);
            let negative = sign_bit(b, y)?;
            b.select(negative, na, a)?
        }
        "fmax" | "fmin" => {
            let m = b.binary(
                if base == "fmax" {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                },
                x,
                y,
            )?;
            if is_float(dtype) {
                let xn = is_nan(b, x)?;
                let yn = is_nan(b, y)?;
                let m = b.select(yn, x, m)?;
                b.select(xn, y, m)?
            } else {
                m
            }
        }
        "heaviside" => {
            let zero = b.constant(Literal::Int(0), b.dtype(x), &b.dims(x));
            let one = b.constant(Literal::Int(1), b.dtype(x), &b.dims(x));
            let is_zero = b.compare(CompareDir::Eq, x, zero)?;
            let positive = b.compare(CompareDir::Gt, x, zero)?;
            let step = b.select(positive, one, zero)?;
            b.select(is_zero, y, step)?
        }
        other => return Err(Error::invalid("binary op", "a known function", other)),
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// True where the float's sign bit is set (also for -0.0 and -nan).
fn sign_bit(b: &mut Builder, x: ValueId) -> Result<ValueId> {
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

/// Unary functions of this module, by base name; integer inputs compute in
/// float32, 16-bit floats in float32.
fn unary_fn(b: &mut Builder) -> Result<()> {
    let name = b
        .op_name()
        .trim_start_matches("aten::")
        .split('.')
        .next()
        .unwrap_or("")
        .to_string();
    let form = if name.ends_with('_') {
        Form::InPlace
    } else {
        Form::Functional
    };
    let base = name
        .trim_end_matches('_')
        .trim_start_matches("special_")
        .to_string();
    let input = b.tensor_arg(0)?.view.dtype;
    if base == "signbit" {
        let x = b.tensor(0)?;
        let out = sign_bit(b, x)?;
        return b.output(out);
    }
    let dtype = if is_float(input) { input } else { DType::F32 };
    let x = b.tensor(0)?;
    let x = b.convert(x, accumulate_dtype(dtype));
    let out = match base.as_str() {
        "exp2" => {
            let ln2 = c(b, std::f64::consts::LN_2, x);
            let s = mul(b, x, ln2)?;
            b.unary(UnaryOp::Exp, s)
        }
        "sinc" => {
            let pi = c(b, std::f64::consts::PI, x);
            let px = mul(b, x, pi)?;
            let s = b.unary(UnaryOp::Sin, px);
            let q = div(b, s, px)?;
            let zero = c(b, 0.0, x);
            let at_zero = b.compare(CompareDir::Eq, x, zero)?;
            let one = c(b, 1.0, x);
            b.select(at_zero, one, q)?
        }
        "angle" => {
            let zero = c(b, 0.0, x);
            let negative = b.compare(CompareDir::Lt, x, zero)?;
            let pi = c(b, std::f64::consts::PI, x);
            let a = b.select(negative, pi, zero)?;
            let nan = is_nan(b, x)?;
            b.select(nan, x, a)?
        }
        "ndtri" => {
            let two = c(b, 2.0, x);
            let t = mul(b, x, two)?;
            let one = c(b, 1.0, x);
            let t = sub(b, t, one)?;
            let e = b.unary(UnaryOp::ErfInv, t);
            let sqrt2 = c(b, std::f64::consts::SQRT_2, e);
            mul(b, e, sqrt2)?
        }
        "entr" => {
            let l = b.unary(UnaryOp::Log, x);
            let v = mul(b, x, l)?;
            let v = b.unary(UnaryOp::Neg, v);
            let zero = c(b, 0.0, x);
            let is_zero = b.compare(CompareDir::Eq, x, zero)?;
            let negative = b.compare(CompareDir::Lt, x, zero)?;
            let v = b.select(is_zero, zero, v)?;
            let neg_inf = c(b, f64::NEG_INFINITY, x);
            b.select(negative, neg_inf, v)?
        }
        "hardsigmoid" => {
            let three = c(b, 3.0, x);
            let t = add(b, x, three)?;
            let zero = c(b, 0.0, x);
            let t = b.binary(BinaryOp::Max, t, zero)?;
            let six = c(b, 6.0, x);
            let t = b.binary(BinaryOp::Min, t, six)?;
            let six = c(b, 6.0, x);
            div(b, t, six)?
        }
        "mish" => {
            let e = b.unary(UnaryOp::Exp, x);
            let sp = b.unary(UnaryOp::Log1p, e);
            // softplus(x) = x for large x (exp overflows).
            let large = c(b, 20.0, x);
            let big = b.compare(CompareDir::Gt, x, large)?;
            let sp = b.select(big, x, sp)?;
            let t = b.unary(UnaryOp::Tanh, sp);
            mul(b, x, t)?
        }
        other => return Err(Error::invalid("unary op", "a known function", other)),
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// threshold(self, threshold, value): x > threshold ? x : value.
fn threshold(b: &mut Builder, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let (dtype, dims) = (b.dtype(x), b.dims(x));
    let t = b.scalar_arg(1, dtype)?;
    let t = b.broadcast_to(t, &dims)?;
    let v = b.scalar_arg(2, dtype)?;
    let v = b.broadcast_to(v, &dims)?;
    let keep = b.compare(CompareDir::Gt, x, t)?;
    let out = b.select(keep, x, v)?;
    finish(b, form, out)
}

/// softshrink / hardshrink (and their backwards with `grad` first).
fn shrink(b: &mut Builder, soft: bool, backward: bool) -> Result<()> {
    let xi = if backward { 1 } else { 0 };
    let x = b.tensor(xi)?;
    let (dtype, dims) = (b.dtype(x), b.dims(x));
    let l = b.scalar_arg(xi + 1, dtype)?;
    let l = b.broadcast_to(l, &dims)?;
    let nl = b.unary(UnaryOp::Neg, l);
    let above = b.compare(CompareDir::Gt, x, l)?;
    let below = b.compare(CompareDir::Lt, x, nl)?;
    let outside = b.binary(BinaryOp::Or, above, below)?;
    let zero = b.constant(Literal::Int(0), dtype, &dims);
    let out = if backward {
        let g = b.tensor(0)?;
        let g = b.convert(g, dtype);
        b.select(outside, g, zero)?
    } else if soft {
        let xm = sub(b, x, l)?;
        let xp = add(b, x, l)?;
        let v = b.select(above, xm, zero)?;
        b.select(below, xp, v)?
    } else {
        b.select(outside, x, zero)?
    };
    b.output(out)
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
    let inf = c(b, f64::INFINITY, x);
    let ninf = c(b, f64::NEG_INFINITY, x);
    let nan = is_nan(b, x)?;
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
            let lo = c(b, eps, x);
            let hi = c(b, 1.0 - eps, x);
            let z = b.binary(BinaryOp::Max, x, lo)?;
            b.binary(BinaryOp::Min, z, hi)?
        }
    };
    let one = c(b, 1.0, z);
    let omz = sub(b, one, z)?;
    let r = div(b, z, omz)?;
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
    let p = c(b, 10f64.powi(decimals.unsigned_abs() as i32), x);
    let out = if decimals >= 0 {
        let s = mul(b, x, p)?;
        let r = b.unary(UnaryOp::RoundNearestEven, s);
        div(b, r, p)?
    } else {
        let s = div(b, x, p)?;
        let r = b.unary(UnaryOp::RoundNearestEven, s);
        mul(b, r, p)?
    };
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// Matrix-vector and batched products: dot/vdot (real), addmv, addbmm,
/// baddbmm, with beta/alpha as device inputs.
fn product(b: &mut Builder, kind: &str, form: Form) -> Result<()> {
    let (lhs, rhs) = match kind {
        "dot" => (0, 1),
        _ => (1, 2),
    };
    let (lv, rv) = (
        b.tensor_arg(lhs)?.view.clone(),
        b.tensor_arg(rhs)?.view.clone(),
    );
    if lv.dtype != rv.dtype {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "the same dtype",
            format!("{} and {}", lv.dtype, rv.dtype),
        ));
    }
    let ranks = match kind {
        "dot" => (1, 1),
        "addmv" => (2, 1),
        _ => (3, 3),
    };
    if lv.sizes.len() != ranks.0 || rv.sizes.len() != ranks.1 {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            format!("{}-D and {}-D tensors", ranks.0, ranks.1),
            format!("{:?} and {:?}", lv.sizes, rv.sizes),
        ));
    }
    let dtype = lv.dtype;
    let acc = accumulate_dtype(dtype);
    let x = b.tensor(lhs)?;
    let y = b.tensor(rhs)?;
    let mut p = match kind {
        "dot" => b.dot(x, y, (&[], &[]), (&[0], &[0]), acc)?,
        "addmv" => b.dot(x, y, (&[], &[]), (&[1], &[0]), acc)?,
        "addbmm" => b.dot(x, y, (&[], &[]), (&[0, 2], &[0, 1]), acc)?,
        _ => b.dot(x, y, (&[0], &[0]), (&[2], &[1]), acc)?,
    };
    if kind == "dot" {
        let p = b.convert(p, dtype);
        return b.output(p);
    }
    let dims = b.dims(p);
    if !matches!(b.arg(4), Ok(Arg::Int(1)) | Err(_)) {
        let alpha = b.scalar_arg(4, acc)?;
        let alpha = b.broadcast_to(alpha, &dims)?;
        p = mul(b, p, alpha)?;
    }
    if !matches!(b.arg(3), Ok(Arg::Int(0)) | Ok(Arg::Float(0.0))) {
        let s = b.tensor(0)?;
        let s = b.convert(s, acc);
        let mut s = b.broadcast_to(s, &dims)?;
        if !matches!(b.arg(3), Ok(Arg::Int(1)) | Err(_)) {
            let beta = b.scalar_arg(3, acc)?;
            let beta = b.broadcast_to(beta, &dims)?;
            s = mul(b, s, beta)?;
        }
        p = add(b, s, p)?;
    }
    let p = b.convert(p, dtype);
    finish(b, form, p)
}

/// trace(self): the sum of a matrix's diagonal (integers sum as int64).
fn trace(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    if view.sizes.len() != 2 {
        return Err(b.arg_error(0, "a matrix", format!("sizes {:?}", view.sizes)));
    }
    let dtype = if is_float(view.dtype) {
        view.dtype
    } else {
        DType::I64
    };
    let x = b.tensor(0)?;
    let x = b.convert(x, accumulate_dtype(dtype));
    let i = b.iota(DType::I64, &view.sizes, 0);
    let j = b.iota(DType::I64, &view.sizes, 1);
    let diag = b.compare(CompareDir::Eq, i, j)?;
    let zero = b.constant(Literal::Int(0), b.dtype(x), &view.sizes);
    let d = b.select(diag, x, zero)?;
    let s = b.reduce(d, ReduceOp::Sum, &[0, 1]);
    let s = b.convert(s, dtype);
    b.output(s)
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

/// nansum(self, dim?, keepdim, *, dtype?): NaNs count as zero.
fn nansum(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = match b.opt_dtype_arg(3)? {
        Some(d) => d,
        None if !is_float(view.dtype) => DType::I64,
        None => view.dtype,
    };
    let dims: Vec<i64> = match b.opt_int_list_arg(1)? {
        Some(d) if !d.is_empty() => d
            .iter()
            .map(|&x| wrap_dim(b, x, view.sizes.len()).map(|v| v as i64))
            .collect::<Result<_>>()?,
        _ => (0..view.sizes.len() as i64).collect(),
    };
    let dims = if view.sizes.is_empty() {
        Vec::new()
    } else {
        dims
    };
    let keepdim = b.bool_arg(2)?;
    let x = b.tensor(0)?;
    let acc = accumulate_dtype(dtype);
    let x = b.convert(x, acc);
    let nan = is_nan(b, x)?;
    let zero = b.constant(Literal::Int(0), acc, &view.sizes);
    let x = b.select(nan, zero, x)?;
    let s = b.reduce(x, ReduceOp::Sum, &dims);
    let s = if keepdim {
        let shape: Vec<i64> = view
            .sizes
            .iter()
            .enumerate()
            .map(|(d, &v)| if dims.contains(&(d as i64)) { 1 } else { v })
            .collect();
        b.reshape(s, &shape)?
    } else {
        s
    };
    let s = b.convert(s, dtype);
    b.output(s)
}

/// count_nonzero.dim_IntList(self, dim) / count_nonzero(self, dim?).
fn count_nonzero(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims: Vec<i64> = match b.arg(1) {
        Ok(Arg::None) | Err(_) => (0..view.sizes.len() as i64).collect(),
        Ok(_) => {
            let d = b.int_list_arg(1)?;
            if d.is_empty() {
                (0..view.sizes.len() as i64).collect()
            } else {
                d.iter()
                    .map(|&x| wrap_dim(b, x, view.sizes.len()).map(|v| v as i64))
                    .collect::<Result<_>>()?
            }
        }
    };
    let dims = if view.sizes.is_empty() {
        Vec::new()
    } else {
        dims
    };
    let x = b.tensor(0)?;
    let nz = b.convert(x, DType::Bool);
    let n = b.convert(nz, DType::I64);
    let s = b.reduce(n, ReduceOp::Sum, &dims);
    b.output(s)
}

/// aminmax(self, *, dim?, keepdim) -> (min, max).
fn aminmax(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dim = b.opt_int_arg(1)?;
    let keepdim = b.bool_arg(2)?;
    let dims: Vec<i64> = match dim {
        Some(d) => vec![wrap_dim(b, d, view.sizes.len())? as i64],
        None => (0..view.sizes.len() as i64).collect(),
    };
    let x = b.tensor(0)?;
    for op in [ReduceOp::Min, ReduceOp::Max] {
        let r = b.reduce(
            x,
            op,
            &if view.sizes.is_empty() {
                vec![]
            } else {
                dims.clone()
            },
        );
        let r = if keepdim {
            let shape: Vec<i64> = view
                .sizes
                .iter()
                .enumerate()
                .map(|(d, &v)| if dims.contains(&(d as i64)) { 1 } else { v })
                .collect();
            b.reshape(r, &shape)?
        } else {
            r
        };
        b.output(r)?;
    }
    Ok(())
}

/// linalg_cross(self, other, *, dim): the cross product along a dim of size 3.
fn cross(b: &mut Builder) -> Result<()> {
    let (x, y, dtype) = binary_operands(b, false)?;
    let dims = b.dims(x);
    let d = wrap_dim(b, b.int_arg(2)?, dims.len())?;
    if dims[d] != 3 {
        return Err(b.arg_error(2, "a dimension of size 3", dims[d]));
    }
    let part = |b: &mut Builder, v: ValueId, k: i64| {
        let mut start = vec![0; dims.len()];
        let mut limit = dims.clone();
        start[d] = k;
        limit[d] = k + 1;
        b.slice(v, &start, &limit, &vec![1; dims.len()])
    };
    let (x0, x1, x2) = (part(b, x, 0), part(b, x, 1), part(b, x, 2));
    let (y0, y1, y2) = (part(b, y, 0), part(b, y, 1), part(b, y, 2));
    let mut comps = Vec::new();
    for (a, bb, cc, dd) in [(x1, y2, x2, y1), (x2, y0, x0, y2), (x0, y1, x1, y0)] {
        let p = mul(b, a, bb)?;
        let q = mul(b, cc, dd)?;
        comps.push(sub(b, p, q)?);
    }
    let out = b.concat(&comps, d)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// take(self, index): elements of the flattened input.
fn take(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let index = b.tensor_arg(1)?.clone();
    let n = view.numel() as i64;
    let values = super::index::host_values(&index)?;
    if let Some(bad) = values.iter().find(|&&v| v < -n || v >= n) {
        return Err(Error::invalid(
            "aten::take: index",
            format!("indices in [{}, {n})", -n),
            format!("index {bad} is out of range"),
        ));
    }
    let wrapped: Vec<i64> = values
        .iter()
        .map(|&v| if v < 0 { v + n } else { v })
        .collect();
    let idx = b.host_tensor(
        wrapped.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::I64,
        &index.view.sizes,
    );
    let x = b.tensor(0)?;
    let flat = b.reshape(x, &[n])?;
    let out = b.flat_gather(flat, idx);
    b.output(out)
}

/// Flat positions in self (sizes `dims`) of every element of a block that
/// has self's shape except `index.len()` along `d`, placed at the
/// host-checked indices of argument 2. Returns (positions, block dims).
fn along_positions(b: &mut Builder, dims: &[i64], d: usize) -> Result<(ValueId, Vec<i64>)> {
    let index = b.tensor_arg(2)?.clone();
    let values = super::index::host_values(&index)?;
    if let Some(bad) = values.iter().find(|&&v| v < -dims[d] || v >= dims[d]) {
        return Err(Error::invalid(
            format!("{}: index", b.op_name()),
            format!("indices in [0, {})", dims[d]),
            format!("index {bad} is out of range"),
        ));
    }
    let k = values.len() as i64;
    let mut upd_dims = dims.to_vec();
    upd_dims[d] = k;
    let wrapped: Vec<i64> = values
        .iter()
        .map(|&v| if v < 0 { v + dims[d] } else { v })
        .collect();
    let idx = b.host_tensor(
        wrapped.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::I64,
        &[k],
    );
    let idx = b.broadcast_in_dim(idx, &upd_dims, &[d as i64]);
    let mut stride = 1i64;
    let mut flat = b.constant(Literal::Int(0), DType::I64, &upd_dims);
    for axis in (0..dims.len()).rev() {
        let coord = if axis == d {
            idx
        } else {
            b.iota(DType::I64, &upd_dims, axis)
        };
        let s = b.constant(Literal::Int(stride), DType::I64, &upd_dims);
        let t = mul(b, coord, s)?;
        flat = add(b, flat, t)?;
        stride *= dims[axis];
    }
    Ok((flat, upd_dims))
}

/// index_add/index_copy/index_fill along `dim` at `index` (host-checked).
fn index_along(b: &mut Builder, kind: &str, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let (flat, upd_dims) = along_positions(b, &dims, d)?;
    let updates = match kind {
        "fill" => {
            let v = if b.is_scalar(3) {
                b.scalar_arg(3, view.dtype)?
            } else {
                let t = b.tensor(3)?;
                b.convert(t, view.dtype)
            };
            b.broadcast_to(v, &upd_dims)?
        }
        _ => {
            let s = b.tensor(3)?;
            let s = b.convert(s, view.dtype);
            let s = b.reshape(s, &upd_dims)?;
            if kind == "add" && !matches!(b.arg(4), Ok(Arg::Int(1)) | Err(_)) {
                let alpha = b.scalar_arg(4, view.dtype)?;
                let alpha = b.broadcast_to(alpha, &upd_dims)?;
                mul(b, s, alpha)?
            } else {
                s
            }
        }
    };
    let x = b.tensor(0)?;
    let n = view.numel() as i64;
    let xf = b.reshape(x, &[n])?;
    let combine = (kind == "add").then_some(ReduceOp::Sum);
    let out = b.flat_scatter(xf, flat, updates, combine);
    let out = b.reshape(out, &view.sizes)?;
    finish(b, form, out)
}

/// index_reduce(self, dim, index, source, reduce, *, include_self).
fn index_reduce(b: &mut Builder, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let (flat, upd_dims) = along_positions(b, &dims, d)?;
    let src = b.tensor(3)?;
    let src = b.convert(src, view.dtype);
    let src = b.reshape(src, &upd_dims)?;
    let out = super::index::reduce_into(b, flat, src, 4, 5)?;
    finish(b, form, out)
}

/// max_unpool2d(self, indices, output_size) / max_unpool3d(self, indices,
/// output_size, stride, padding): values placed at their indices within
/// each output plane, zeros elsewhere.
fn max_unpool(b: &mut Builder, k: usize) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let out = b.int_list_arg(2)?;
    if out.len() != k || view.sizes.len() < k + 1 {
        return Err(b.arg_error(
            2,
            format!("{k} output sizes for a ({})-D or more input", k + 1),
            format!("{out:?}"),
        ));
    }
    let r = view.sizes.len();
    let planes: i64 = view.sizes[..r - k].iter().product();
    let per_plane_in: i64 = view.sizes[r - k..].iter().product();
    let per_plane_out: i64 = out.iter().product();
    let index = b.tensor_arg(1)?.clone();
    let values = super::index::host_values(&index)?;
    if let Some(bad) = values.iter().find(|&&v| v < 0 || v >= per_plane_out) {
        return Err(b.arg_error(
            1,
            format!("indices in [0, {per_plane_out})"),
            format!("index {bad} is out of bounds"),
        ));
    }
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[planes, per_plane_in])?;
    let idx = b.tensor(1)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &[planes, per_plane_in])?;
    let plane = b.iota(DType::I64, &[planes, per_plane_in], 0);
    let size = b.constant(
        Literal::Int(per_plane_out),
        DType::I64,
        &[planes, per_plane_in],
    );
    let base = mul(b, plane, size)?;
    let flat = add(b, base, idx)?;
    let zeros = b.constant(Literal::Int(0), view.dtype, &[planes * per_plane_out]);
    let y = b.flat_scatter(zeros, flat, x, None);
    let mut sizes = view.sizes[..r - k].to_vec();
    sizes.extend(&out);
    let y = b.reshape(y, &sizes)?;
    b.output(y)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::{Functional as F, InPlace as I};
    let mut ops = vec![
        op("aten::dot", |b| product(b, "dot", F)),
        op("aten::dot.out", |b| product(b, "dot", F)),
        op("aten::vdot", |b| product(b, "dot", F)),
        op("aten::vdot.out", |b| product(b, "dot", F)),
        op("aten::addmv", |b| product(b, "addmv", F)),
        op("aten::addmv.out", |b| product(b, "addmv", F)),
        op("aten::addmv_", |b| product(b, "addmv", I)),
        op("aten::addbmm", |b| product(b, "addbmm", F)),
        op("aten::addbmm.out", |b| product(b, "addbmm", F)),
        op("aten::addbmm_", |b| product(b, "addbmm", I)),
        op("aten::baddbmm", |b| product(b, "baddbmm", F)),
        op("aten::baddbmm.out", |b| product(b, "baddbmm", F)),
        op("aten::baddbmm_", |b| product(b, "baddbmm", I)),
        op("aten::threshold", |b| threshold(b, F)),
        op("aten::threshold.out", |b| threshold(b, F)),
        op("aten::threshold_", |b| threshold(b, I)),
        op("aten::softshrink", |b| shrink(b, true, false)),
        op("aten::softshrink.out", |b| shrink(b, true, false)),
        op("aten::softshrink_backward", |b| shrink(b, true, true)),
        op("aten::hardshrink", |b| shrink(b, false, false)),
        op("aten::hardshrink.out", |b| shrink(b, false, false)),
        op("aten::hardshrink_backward", |b| shrink(b, false, true)),
        op("aten::nan_to_num", |b| nan_to_num(b, F)),
        op("aten::nan_to_num.out", |b| nan_to_num(b, F)),
        op("aten::nan_to_num_", |b| nan_to_num(b, I)),
        op("aten::logit", |b| logit(b, F)),
        op("aten::logit.out", |b| logit(b, F)),
        op("aten::logit_", |b| logit(b, I)),
        op("aten::round.decimals", |b| round_decimals(b, F)),
        op("aten::round.decimals_out", |b| round_decimals(b, F)),
        op("aten::round_.decimals", |b| round_decimals(b, I)),
        op("aten::trace", trace),
        op("aten::eye.out", |b| eye(b, false)),
        op("aten::eye.m_out", |b| eye(b, true)),
        op("aten::nansum", nansum),
        op("aten::nansum.out", nansum),
        op("aten::count_nonzero", count_nonzero),
        op("aten::count_nonzero.dim_IntList", count_nonzero),
        op("aten::aminmax", aminmax),
        op("aten::aminmax.out", aminmax),
        op("aten::linalg_cross", cross),
        op("aten::linalg_cross.out", cross),
        op("aten::take", take),
        op("aten::take.out", take),
        op("aten::index_add", |b| index_along(b, "add", F)),
        op("aten::index_add.out", |b| index_along(b, "add", F)),
        op("aten::index_add_", |b| index_along(b, "add", I)),
        op("aten::index_copy", |b| index_along(b, "copy", F)),
        op("aten::index_copy.out", |b| index_along(b, "copy", F)),
        op("aten::index_copy_", |b| index_along(b, "copy", I)),
        op("aten::index_fill.int_Scalar", |b| index_along(b, "fill", F)),
        op("aten::index_fill_.int_Scalar", |b| {
            index_along(b, "fill", I)
        }),
        op("aten::index_fill.int_Tensor", |b| index_along(b, "fill", F)),
        op("aten::index_fill_.int_Tensor", |b| {
            index_along(b, "fill", I)
        }),
        op("aten::index_reduce", |b| index_reduce(b, F)),
        op("aten::index_reduce.out", |b| index_reduce(b, F)),
        op("aten::index_reduce_", |b| index_reduce(b, I)),
        op("aten::max_unpool2d", |b| max_unpool(b, 2)),
        op("aten::max_unpool2d.out", |b| max_unpool(b, 2)),
        op("aten::max_unpool3d", |b| max_unpool(b, 3)),
        op("aten::max_unpool3d.out", |b| max_unpool(b, 3)),
    ];
    for name in [
        "aten::xlogy.Tensor",
        "aten::xlogy.OutTensor",
        "aten::xlogy_.Tensor",
        "aten::xlogy.Scalar_Other",
        "aten::xlogy.Scalar_Self",
        "aten::special_xlog1py",
        "aten::special_xlog1py.out",
        "aten::special_xlog1py.self_scalar",
        "aten::special_xlog1py.other_scalar",
        "aten::logaddexp",
        "aten::logaddexp.out",
        "aten::logaddexp2",
        "aten::logaddexp2.out",
        "aten::copysign.Tensor",
        "aten::copysign.out",
        "aten::copysign_.Tensor",
        "aten::copysign.Scalar",
        "aten::copysign_.Scalar",
        "aten::fmax",
        "aten::fmax.out",
        "aten::fmin",
        "aten::fmin.out",
        "aten::heaviside",
        "aten::heaviside.out",
        "aten::heaviside_",
    ] {
        ops.push(op(name, binary_fn));
    }
    for name in [
        "aten::exp2",
        "aten::exp2.out",
        "aten::exp2_",
        "aten::sinc",
        "aten::sinc.out",
        "aten::sinc_",
        "aten::angle",
        "aten::angle.out",
        "aten::special_ndtri",
        "aten::special_ndtri.out",
        "aten::special_entr",
        "aten::special_entr.out",
        "aten::hardsigmoid",
        "aten::hardsigmoid.out",
        "aten::hardsigmoid_",
        "aten::mish",
        "aten::mish.out",
        "aten::mish_",
        "aten::signbit",
        "aten::signbit.out",
    ] {
        ops.push(op(name, unary_fn));
    }
    ops
}
