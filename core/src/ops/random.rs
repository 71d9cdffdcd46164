//! Random fills and draws from the op's generator argument (a Threefry
//! key from its seed and offset): uniform, normal, random integers,
//! bernoulli, exponential, geometric, log-normal, Cauchy; and dropout's
//! backward.

use super::{broadcast_scalar, require_float, wide_float, OpDef};
use crate::builder::{Arg, Builder};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, UnaryOp, ValueId};

/// Uniform [0, 1) floats of `dtype` and `dims` from the generator argument.
fn uniform01(b: &mut Builder, generator: usize, dtype: DType, dims: &[i64]) -> Result<ValueId> {
    uniform_stream(b, generator, dtype, dims, 0)
}

/// A second uniform draw, independent of `uniform01`'s for the same
/// generator state.
fn uniform01_second(
    b: &mut Builder,
    generator: usize,
    dtype: DType,
    dims: &[i64],
) -> Result<ValueId> {
    uniform_stream(b, generator, dtype, dims, 1 << 63)
}

/// Uniform [0, 1) floats from the Threefry key (seed, offset ^ stream).
fn uniform_stream(
    b: &mut Builder,
    generator: usize,
    dtype: DType,
    dims: &[i64],
    stream: u64,
) -> Result<ValueId> {
    let (seed, offset) = match b.arg(generator)? {
        Arg::Generator { seed, offset } => (*seed, *offset),
        other => {
            return Err(b.arg_error(
                generator,
                "a Generator (the device's default when None)",
                other.kind(),
            ))
        }
    };
    let key = b.rng_key(seed, offset ^ stream);
    // 23 (or 52) random mantissa bits under exponent 0 give [1, 2); minus 1.
    let (bits_ty, float_ty, shift, one_bits) = if dtype == DType::F64 {
        (
            DType::U64,
            DType::F64,
            12i64,
            0x3FF0_0000_0000_0000u64 as i64,
        )
    } else {
        (DType::U32, DType::F32, 9, 0x3F80_0000)
    };
    let bits = b.rng_bits(key, bits_ty, dims);
    let shift = b.constant(Literal::Int(shift), bits_ty, dims);
    let mantissa = b.binary(BinaryOp::ShiftRightLogical, bits, shift)?;
    let one = b.constant(Literal::Int(one_bits), bits_ty, dims);
    let with_exponent = b.binary(BinaryOp::Or, mantissa, one)?;
    let in_one_two = b.bitcast(with_exponent, float_ty);
    let one_f = b.constant(Literal::Float(1.0), float_ty, dims);
    b.binary(BinaryOp::Sub, in_one_two, one_f)
}

/// A standard normal from two independent uniforms in [0, 1) (Box-Muller).
fn box_muller(b: &mut Builder, u1: ValueId, u2: ValueId) -> Result<ValueId> {
    let (dtype, dims) = (b.dtype(u1), b.dims(u1));
    // 1 - u1 lies in (0, 1], so its log is finite.
    let one = b.constant(Literal::Float(1.0), dtype, &dims);
    let u1 = b.binary(BinaryOp::Sub, one, u1)?;
    let log = b.unary(UnaryOp::Log, u1);
    let minus_two = b.constant(Literal::Float(-2.0), dtype, &dims);
    let r2 = b.binary(BinaryOp::Mul, minus_two, log)?;
    let r = b.unary(UnaryOp::Sqrt, r2);
    let two_pi = b.constant(Literal::Float(std::f64::consts::TAU), dtype, &dims);
    let theta = b.binary(BinaryOp::Mul, two_pi, u2)?;
    let c = b.unary(UnaryOp::Cos, theta);
    b.binary(BinaryOp::Mul, r, c)
}

/// The random ops need a floating-point destination.
fn float_destination(b: &Builder) -> Result<(DType, Dims)> {
    let view = &b.tensor_arg(0)?.view;
    require_float(b, "self", view.dtype)?;
    Ok((view.dtype, view.sizes.clone()))
}

/// uniform_(self, from, to, *, generator).
fn uniform(b: &mut Builder) -> Result<()> {
    let (dtype, dims) = float_destination(b)?;
    let (from, to) = (b.float_arg(1)?, b.float_arg(2)?);
    if from > to {
        return Err(Error::invalid(
            "aten::uniform_: range",
            "from <= to",
            format!("from={from} to={to}"),
        ));
    }
    let work = wide_float(dtype);
    let u = uniform01(b, 3, dtype, &dims)?;
    let lo = broadcast_scalar(b, 1, work, &dims)?;
    let hi = broadcast_scalar(b, 2, work, &dims)?;
    let width = b.binary(BinaryOp::Sub, hi, lo)?;
    let scaled = b.binary(BinaryOp::Mul, u, width)?;
    let out = b.binary(BinaryOp::Add, lo, scaled)?;
    b.write_arg(0, out)
}

/// normal_(self, mean, std, *, generator), by Box-Muller.
fn normal(b: &mut Builder) -> Result<()> {
    let (dtype, dims) = float_destination(b)?;
    if b.float_arg(2)? < 0.0 {
        return Err(Error::invalid(
            "aten::normal_: std",
            "std >= 0",
            b.float_arg(2)?,
        ));
    }
    let work = wide_float(dtype);
    let u1 = uniform01(b, 3, dtype, &dims)?;
    let u2 = uniform01_second(b, 3, dtype, &dims)?;
    let z = box_muller(b, u1, u2)?;
    let std = broadcast_scalar(b, 2, work, &dims)?;
    let mean = broadcast_scalar(b, 1, work, &dims)?;
    let scaled = b.binary(BinaryOp::Mul, z, std)?;
    let out = b.binary(BinaryOp::Add, mean, scaled)?;
    b.write_arg(0, out)
}

/// random_.from(self, from, to?, *, generator), random_.to(self, to, *,
/// generator) and random_(self, *, generator): integers uniform in
/// [from, to), `from` 0 when absent and `to` up to the dtype's largest
/// exactly representable value, as in torch.
fn random(
    b: &mut Builder,
    from_index: Option<usize>,
    to_index: Option<usize>,
    generator: usize,
) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let from = match from_index {
        Some(i) => b.int_arg(i)?,
        None => 0,
    };
    let to = match to_index.map(|i| b.opt_int_arg(i)).transpose()?.flatten() {
        Some(t) => t,
        None => match view.dtype {
            DType::Bool => 2,
            DType::I8 => i8::MAX as i64 + 1,
            DType::U8 => u8::MAX as i64 + 1,
            DType::I16 => i16::MAX as i64 + 1,
            DType::I32 => i32::MAX as i64 + 1,
            DType::F16 => 1 << 11,
            DType::BF16 => 1 << 8,
            DType::F32 => 1 << 24,
            DType::F64 => 1 << 53,
            _ => i64::MAX,
        },
    };
    if to <= from {
        return Err(Error::invalid(
            "aten::random_: range",
            "from < to",
            format!("from={from} to={to}"),
        ));
    }
    let (seed, offset) = match b.arg(generator)? {
        Arg::Generator { seed, offset } => (*seed, *offset),
        other => return Err(b.arg_error(generator, "a Generator", other.kind())),
    };
    let key = b.rng_key(seed, offset);
    let bits = b.rng_bits(key, DType::U64, &view.sizes);
    let range = b.constant(Literal::Int(to.wrapping_sub(from)), DType::U64, &view.sizes);
    let r = b.binary(BinaryOp::Rem, bits, range)?;
    let r = b.convert(r, DType::I64);
    let f = b.constant(Literal::Int(from), DType::I64, &view.sizes);
    let out = b.binary(BinaryOp::Add, r, f)?;
    b.write_arg(0, out)
}

/// bernoulli_.float(self, p, *, generator) / bernoulli_.Tensor(self, p,
/// *, generator) / bernoulli(self, *, generator) (probabilities from self) /
/// bernoulli.p(self, p, *, generator): 1 with probability p, else 0.
fn bernoulli(
    b: &mut Builder,
    p_index: Option<usize>,
    generator: usize,
    in_place: bool,
) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = view.sizes.clone();
    let u = uniform01(b, generator, DType::F32, &dims)?;
    let p = match p_index {
        Some(i) if b.is_scalar(i) => {
            let prob = b.float_arg(i)?;
            if !(0.0..=1.0).contains(&prob) {
                return Err(b.arg_error(i, "a probability in [0, 1]", prob));
            }
            let p = b.scalar_arg(i, DType::F32)?;
            b.broadcast_to(p, &dims)?
        }
        Some(i) => {
            let p = b.tensor(i)?;
            let p = b.convert(p, DType::F32);
            b.broadcast_to(p, &dims)?
        }
        None => {
            let p = b.tensor(0)?;
            b.convert(p, DType::F32)
        }
    };
    let hit = b.compare(CompareDir::Lt, u, p)?;
    let out = b.convert(hit, view.dtype);
    if in_place {
        b.write_arg(0, out)
    } else {
        b.output(out)
    }
}

/// native_dropout_backward(grad_output, mask, scale) = grad * mask * scale.
fn dropout_backward(b: &mut Builder) -> Result<()> {
    let g = b.tensor(0)?;
    let dtype = b.dtype(g);
    let dims = b.dims(g);
    let m = b.tensor(1)?;
    let m = b.convert(m, dtype);
    let m = b.broadcast_to(m, &dims)?;
    let s = broadcast_scalar(b, 2, dtype, &dims)?;
    let gm = b.binary(BinaryOp::Mul, g, m)?;
    let out = b.binary(BinaryOp::Mul, gm, s)?;
    b.output(out)
}

/// The distributions `random_fill` draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    Exponential,
    Geometric,
    LogNormal,
    Cauchy,
}

/// Random fills from uniform draws: exponential_(lambd), geometric_(p),
/// log_normal_(mean, std), cauchy_(median, sigma); the generator follows
/// the two parameters (one for the one-parameter forms).
fn random_fill(b: &mut Builder, kind: Fill) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    require_float(b, "self", view.dtype)?;
    let two_params = matches!(kind, Fill::LogNormal | Fill::Cauchy);
    let generator = if two_params { 3 } else { 2 };
    let work = wide_float(view.dtype);
    let dims = view.sizes.clone();
    let u = uniform01(b, generator, work, &dims)?;
    let one = b.constant(Literal::Float(1.0), work, &dims);
    let p1 = broadcast_scalar(b, 1, work, &dims)?;
    let out = match kind {
        Fill::Exponential => {
            // -log(1 - u) / lambda, with 1 - u in (0, 1].
            let omu = b.binary(BinaryOp::Sub, one, u)?;
            let l = b.unary(UnaryOp::Log, omu);
            let l = b.unary(UnaryOp::Neg, l);
            b.binary(BinaryOp::Div, l, p1)?
        }
        Fill::Geometric => {
            // ceil(log(1 - u) / log(1 - p)), at least 1.
            let omu = b.binary(BinaryOp::Sub, one, u)?;
            let lu = b.unary(UnaryOp::Log, omu);
            let omp = b.binary(BinaryOp::Sub, one, p1)?;
            let lp = b.unary(UnaryOp::Log, omp);
            let q = b.binary(BinaryOp::Div, lu, lp)?;
            let c = b.unary(UnaryOp::Ceil, q);
            b.binary(BinaryOp::Max, c, one)?
        }
        Fill::LogNormal => {
            let u2 = uniform01_second(b, generator, work, &dims)?;
            let z = box_muller(b, u, u2)?;
            let p2 = broadcast_scalar(b, 2, work, &dims)?;
            let sz = b.binary(BinaryOp::Mul, z, p2)?;
            let e = b.binary(BinaryOp::Add, sz, p1)?;
            b.unary(UnaryOp::Exp, e)
        }
        Fill::Cauchy => {
            // median + sigma tan(pi (u - 1/2))
            let half = b.constant(Literal::Float(0.5), work, &dims);
            let c = b.binary(BinaryOp::Sub, u, half)?;
            let pi = b.constant(Literal::Float(std::f64::consts::PI), work, &dims);
            let a = b.binary(BinaryOp::Mul, pi, c)?;
            let t = b.unary(UnaryOp::Tan, a);
            let p2 = broadcast_scalar(b, 2, work, &dims)?;
            let st = b.binary(BinaryOp::Mul, p2, t)?;
            b.binary(BinaryOp::Add, p1, st)?
        }
    };
    b.write_arg(0, out)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op!("aten::uniform_", uniform()),
        op!("aten::normal_", normal()),
        op!("aten::random_.from", random(Some(1), Some(2), 3)),
        op!("aten::random_.to", random(None, Some(1), 2)),
        op!("aten::random_", random(None, None, 1)),
        op!("aten::bernoulli_.float", bernoulli(Some(1), 2, true)),
        op!("aten::bernoulli_.Tensor", bernoulli(Some(1), 2, true)),
        op!("aten::bernoulli", bernoulli(None, 1, false)),
        op!("aten::bernoulli.p", bernoulli(Some(1), 2, false)),
        op!("aten::exponential_", random_fill(Fill::Exponential)),
        op!("aten::geometric_", random_fill(Fill::Geometric)),
        op!("aten::log_normal_", random_fill(Fill::LogNormal)),
        op!("aten::cauchy_", random_fill(Fill::Cauchy)),
        op!("aten::native_dropout_backward", dropout_backward()),
    ]
}
