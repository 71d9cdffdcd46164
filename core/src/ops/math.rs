//! The remaining elementwise math: unary functions, integer-aware binary
//! ops, bitwise and logical ops. Each op comes in functional, `.out` and
//! in-place form; one lowering per family reads the op's base name.

use super::{broadcast_all, finish, is_float, is_integral, op, operand, result_type, Form, OpDef};
use crate::builder::Builder;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, UnaryOp, ValueId};

/// "aten::erf_" → ("erf", in-place); ".out" and ".Tensor"-style overloads
/// are functional.
fn base_and_form(name: &str) -> (&str, Form) {
    let bare = name.trim_start_matches("aten::");
    let base = bare.split('.').next().unwrap_or(bare);
    match base.strip_suffix('_') {
        Some(stripped) => (stripped, Form::InPlace),
        None => (base, Form::Functional),
    }
}

/// Unary float functions (integer inputs compute in float32).
const FLOAT_UNARY: [&str; 21] = [
    "erf",
    "erfc",
    "erfinv",
    "lgamma",
    "digamma",
    "log1p",
    "expm1",
    "sin",
    "cos",
    "tan",
    "atan",
    "asin",
    "acos",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "log2",
    "log10",
    "reciprocal",
];

fn float_unary_value(b: &mut Builder, base: &str, x: ValueId) -> Result<ValueId> {
    let dims = b.dims(x);
    let dtype = b.dtype(x);
    Ok(match base {
        "erf" => b.unary(UnaryOp::Erf, x),
        "erfinv" => b.unary(UnaryOp::ErfInv, x),
        "lgamma" => b.unary(UnaryOp::Lgamma, x),
        "digamma" => b.unary(UnaryOp::Digamma, x),
        "log1p" => b.unary(UnaryOp::Log1p, x),
        "expm1" => b.unary(UnaryOp::Expm1, x),
        "sin" => b.unary(UnaryOp::Sin, x),
        "cos" => b.unary(UnaryOp::Cos, x),
        "erfc" => b.unary(UnaryOp::Erfc, x),
        "tan" => b.unary(UnaryOp::Tan, x),
        "atan" => b.unary(UnaryOp::Atan, x),
        "asin" => b.unary(UnaryOp::Asin, x),
        "acos" => b.unary(UnaryOp::Acos, x),
        "sinh" => b.unary(UnaryOp::Sinh, x),
        "cosh" => b.unary(UnaryOp::Cosh, x),
        "asinh" => b.unary(UnaryOp::Asinh, x),
        "acosh" => b.unary(UnaryOp::Acosh, x),
        "atanh" => b.unary(UnaryOp::Atanh, x),
        "log2" | "log10" => {
            let ln = b.unary(UnaryOp::Log, x);
            let base_ln = if base == "log2" {
                std::f64::consts::LN_2
            } else {
                std::f64::consts::LN_10
            };
            let c = b.constant(Literal::Float(1.0 / base_ln), dtype, &dims);
            b.binary(BinaryOp::Mul, ln, c)?
        }
        "reciprocal" => {
            let one = b.constant(Literal::Int(1), dtype, &dims);
            b.binary(BinaryOp::Div, one, x)?
        }
        other => return Err(Error::invalid("unary math op", "a known function", other)),
    })
}

fn float_unary(b: &mut Builder) -> Result<()> {
    let (base, form) = base_and_form(b.op_name());
    let input = b.tensor_arg(0)?.view.dtype;
    let dtype = if is_float(input) { input } else { DType::F32 };
    let x = b.tensor(0)?;
    let x = b.convert(x, dtype);
    let out = float_unary_value(b, base, x)?;
    finish(b, form, out)
}

/// Rounding and sign ops, which keep the dtype (identity on integers).
fn same_dtype_unary(b: &mut Builder) -> Result<()> {
    let (base, form) = base_and_form(b.op_name());
    let x = b.tensor(0)?;
    let dtype = b.dtype(x);
    let out = if !is_float(dtype) {
        match base {
            "sign" | "sgn" => {
                if dtype == DType::Bool {
                    x
                } else {
                    b.unary(UnaryOp::Sign, x)
                }
            }
            "frac" => {
                return Err(Error::invalid(
                    format!("{}: input", b.op_name()),
                    "a floating point tensor",
                    dtype,
                ))
            }
            _ => x,
        }
    } else {
        match base {
            "floor" => b.unary(UnaryOp::Floor, x),
            "ceil" => b.unary(UnaryOp::Ceil, x),
            "round" => b.unary(UnaryOp::RoundNearestEven, x),
            "sign" | "sgn" => b.unary(UnaryOp::Sign, x),
            "trunc" | "frac" => {
                let a = b.unary(UnaryOp::Abs, x);
                let f = b.unary(UnaryOp::Floor, a);
                let s = b.unary(UnaryOp::Sign, x);
                let t = b.binary(BinaryOp::Mul, s, f)?;
                if base == "frac" {
                    b.binary(BinaryOp::Sub, x, t)?
                } else {
                    t
                }
            }
            other => return Err(Error::invalid("rounding op", "a known function", other)),
        }
    };
    finish(b, form, out)
}

/// bitwise_not (integers and bool) and logical_not (to bool).
fn not(b: &mut Builder) -> Result<()> {
    let (base, form) = base_and_form(b.op_name());
    let x = b.tensor(0)?;
    let dtype = b.dtype(x);
    let out = if base == "logical_not" {
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

/// remainder (sign of the divisor), fmod (sign of the dividend), atan2,
/// hypot, bitwise and/or/xor, logical and/or/xor, floor_divide.
fn binary(b: &mut Builder) -> Result<()> {
    let (base, form) = base_and_form(b.op_name());
    let promoted = result_type(b, &[0, 1])?;
    let logical = base.starts_with("logical_");
    let float_only = matches!(base, "atan2" | "hypot");
    let dtype = if logical {
        DType::Bool
    } else if float_only && !is_float(promoted) {
        DType::F32
    } else {
        promoted
    };
    if base.starts_with("bitwise_") && !is_integral(dtype, true) {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "integer or bool tensors",
            dtype,
        ));
    }
    let x = if logical {
        bool_operand(b, 0)?
    } else {
        operand(b, 0, dtype)?
    };
    let y = if logical {
        bool_operand(b, 1)?
    } else {
        operand(b, 1, dtype)?
    };
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    // 16-bit floats compute in float32 and round once, as ATen's kernels do.
    let acc = super::reduce::accumulate_dtype(dtype);
    let (x, y) = (b.convert(x, acc), b.convert(y, acc));
    let dims = b.dims(x);
    let out = match base {
        "fmod" => b.binary(BinaryOp::Rem, x, y)?,
        "remainder" => {
            let r = b.binary(BinaryOp::Rem, x, y)?;
            let zero = b.constant(Literal::Int(0), acc, &dims);
            let nonzero = b.compare(CompareDir::Ne, r, zero)?;
            let rn = b.compare(CompareDir::Lt, r, zero)?;
            let yn = b.compare(CompareDir::Lt, y, zero)?;
            let differ = b.binary(BinaryOp::Xor, rn, yn)?;
            let fix = b.binary(BinaryOp::And, nonzero, differ)?;
            let shifted = b.binary(BinaryOp::Add, r, y)?;
            b.select(fix, shifted, r)?
        }
        "floor_divide" => {
            let q = b.binary(BinaryOp::Div, x, y)?;
            if is_float(acc) {
                b.unary(UnaryOp::Floor, q)
            } else {
                let r = b.binary(BinaryOp::Rem, x, y)?;
                let zero = b.constant(Literal::Int(0), acc, &dims);
                let inexact = b.compare(CompareDir::Ne, r, zero)?;
                let xn = b.compare(CompareDir::Lt, x, zero)?;
                let yn = b.compare(CompareDir::Lt, y, zero)?;
                let differ = b.binary(BinaryOp::Xor, xn, yn)?;
                let adjust = b.binary(BinaryOp::And, inexact, differ)?;
                let one = b.constant(Literal::Int(1), acc, &dims);
                let q1 = b.binary(BinaryOp::Sub, q, one)?;
                b.select(adjust, q1, q)?
            }
        }
        "atan2" => b.binary(BinaryOp::Atan2, x, y)?,
        "hypot" => {
            let xx = b.binary(BinaryOp::Mul, x, x)?;
            let yy = b.binary(BinaryOp::Mul, y, y)?;
            let s = b.binary(BinaryOp::Add, xx, yy)?;
            b.unary(UnaryOp::Sqrt, s)
        }
        "bitwise_and" | "logical_and" => b.binary(BinaryOp::And, x, y)?,
        "bitwise_or" | "logical_or" => b.binary(BinaryOp::Or, x, y)?,
        "bitwise_xor" | "logical_xor" => b.binary(BinaryOp::Xor, x, y)?,
        other => return Err(Error::invalid("binary math op", "a known function", other)),
    };
    let out = b.convert(out, dtype);
    let out = if logical && form == Form::InPlace {
        let target = b.tensor_arg(0)?.view.dtype;
        b.convert(out, target)
    } else {
        out
    };
    finish(b, form, out)
}

/// Tensor or scalar argument `index` as bool (nonzero).
fn bool_operand(b: &mut Builder, index: usize) -> Result<ValueId> {
    if b.is_scalar(index) {
        return b.scalar_arg(index, DType::Bool);
    }
    let v = b.tensor(index)?;
    Ok(b.convert(v, DType::Bool))
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

/// Table names built at run time are leaked: the table is built once per
/// process and lives as long as it.
pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = Vec::new();
    let forms = |name: &'static str| -> [String; 3] {
        [
            format!("aten::{name}"),
            format!("aten::{name}.out"),
            format!("aten::{name}_"),
        ]
    };
    for name in FLOAT_UNARY {
        for full in forms(name) {
            ops.push(op(Box::leak(full.into_boxed_str()), float_unary));
        }
    }
    for name in ["floor", "ceil", "round", "trunc", "frac", "sign", "sgn"] {
        for full in forms(name) {
            ops.push(op(Box::leak(full.into_boxed_str()), same_dtype_unary));
        }
    }
    for name in ["bitwise_not", "logical_not"] {
        for full in forms(name) {
            ops.push(op(Box::leak(full.into_boxed_str()), not));
        }
    }
    for (name, overloads) in [
        (
            "remainder",
            &["Tensor", "Scalar", "Tensor_out", "Scalar_out"][..],
        ),
        (
            "fmod",
            &["Tensor", "Scalar", "Tensor_out", "Scalar_out"][..],
        ),
        ("atan2", &["", "out"][..]),
        ("hypot", &["", "out"][..]),
        ("floor_divide", &["", "Scalar", "out"][..]),
        (
            "bitwise_and",
            &["Tensor", "Scalar", "Tensor_out", "Scalar_out"][..],
        ),
        (
            "bitwise_or",
            &["Tensor", "Scalar", "Tensor_out", "Scalar_out"][..],
        ),
        (
            "bitwise_xor",
            &["Tensor", "Scalar", "Tensor_out", "Scalar_out"][..],
        ),
        ("logical_and", &["", "out"][..]),
        ("logical_or", &["", "out"][..]),
        ("logical_xor", &["", "out"][..]),
    ] {
        for overload in overloads {
            let full = if overload.is_empty() {
                format!("aten::{name}")
            } else {
                format!("aten::{name}.{overload}")
            };
            ops.push(op(Box::leak(full.into_boxed_str()), binary));
            // In-place forms exist for the non-out overloads.
            if !overload.ends_with("out") {
                let inplace = match (name, *overload) {
                    // floor_divide's in-place form names its Tensor overload.
                    ("floor_divide", "") => "aten::floor_divide_.Tensor".to_string(),
                    (_, "") => format!("aten::{name}_"),
                    _ => format!("aten::{name}_.{overload}"),
                };
                ops.push(op(Box::leak(inplace.into_boxed_str()), binary));
            }
        }
    }
    ops.push(op("aten::isnan", isnan));
    ops
}
