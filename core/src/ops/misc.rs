//! Concatenation, indexing, ranges and random fills.

use super::{is_float, op, promote_types, wrap_dim, OpDef};
use crate::builder::{Arg, Builder, TensorArg};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, UnaryOp, ValueId};

fn cat(b: &mut Builder) -> Result<()> {
    // Legacy behaviour kept by ATen: 1-D empty tensors are skipped.
    let tensors: Vec<TensorArg> = b
        .tensor_list_arg(0)?
        .into_iter()
        .filter(|t| !(t.view.sizes.len() == 1 && t.view.sizes[0] == 0))
        .cloned()
        .collect();
    let all = b.tensor_list_arg(0)?;
    let Some(first) = tensors.first().or(all.first().copied()) else {
        return Err(Error::invalid(
            "aten::cat: tensors",
            "a non-empty list",
            "an empty list",
        ));
    };
    let rank = first.view.sizes.len();
    if rank == 0 {
        return Err(Error::invalid(
            "aten::cat: tensors",
            "tensors of rank >= 1",
            "a zero-dimensional tensor",
        ));
    }
    let dim = wrap_dim(b, b.int_arg(1)?, rank)?;
    let dtype = tensors
        .iter()
        .map(|t| t.view.dtype)
        .reduce(promote_types)
        .unwrap_or(first.view.dtype);
    for t in &tensors {
        let same = t.view.sizes.len() == rank
            && t.view
                .sizes
                .iter()
                .enumerate()
                .all(|(d, &s)| d == dim || s == first.view.sizes[d]);
        if !same {
            return Err(Error::invalid(
                "aten::cat: tensor sizes",
                format!(
                    "sizes matching {:?} except in dimension {dim}",
                    first.view.sizes
                ),
                format!("{:?}", t.view.sizes),
            ));
        }
    }
    if tensors.is_empty() {
        let out = b.constant(Literal::Int(0), dtype, &[0]);
        return b.output(out);
    }
    let mut values = Vec::new();
    for t in &tensors {
        let v = b.read(t)?;
        values.push(b.convert(v, dtype));
    }
    let out = b.concat(&values, dim)?;
    b.output(out)
}

/// Checks every index is in `[-size, size)`: a bad index is a clear error.
fn check_indices(b: &mut Builder, index: usize, size: i64) -> Result<()> {
    let t = b.tensor_arg(index)?;
    if matches!(t.view.dtype, DType::Bool) || is_float(t.view.dtype) {
        return Err(b.arg_error(index, "an integer index tensor", t.view.dtype));
    }
    let what = format!("{}: index", b.op_name());
    b.check_range(t, (-size, size), None, |bad| {
        Error::invalid(
            what.clone(),
            format!("indices in [{}, {size})", -size),
            format!("index {bad} out of range for a dimension of size {size}"),
        )
    })
}

/// Flat storage indices into `x_dims` (row-major) for an output of
/// `out_dims`, taking `index_value` (s64, of `out_dims`) along `dim` and the
/// output position elsewhere. Negative indices wrap.
fn flat_indices(
    b: &mut Builder,
    x_dims: &[i64],
    out_dims: &[i64],
    dim: usize,
    index_value: ValueId,
) -> Result<ValueId> {
    let size = b.constant(Literal::Int(x_dims[dim]), DType::I64, out_dims);
    let zero = b.constant(Literal::Int(0), DType::I64, out_dims);
    let negative = b.compare(crate::ir::CompareDir::Lt, index_value, zero)?;
    let wrapped = b.binary(BinaryOp::Add, index_value, size)?;
    let index_value = b.select(negative, wrapped, index_value)?;
    let mut stride = 1i64;
    let mut acc = b.constant(Literal::Int(0), DType::I64, out_dims);
    for d in (0..x_dims.len()).rev() {
        let coord = if d == dim {
            index_value
        } else {
            b.iota(DType::I64, out_dims, d)
        };
        let s = b.constant(Literal::Int(stride), DType::I64, out_dims);
        let term = b.binary(BinaryOp::Mul, coord, s)?;
        acc = b.binary(BinaryOp::Add, acc, term)?;
        stride *= x_dims[d];
    }
    Ok(acc)
}

fn index_select(b: &mut Builder) -> Result<()> {
    let x_view = b.tensor_arg(0)?.view.clone();
    let index_view = b.tensor_arg(2)?.view.clone();
    if index_view.sizes.len() > 1 {
        return Err(b.arg_error(
            2,
            "a 0-D or 1-D index",
            format!("{}-D", index_view.sizes.len()),
        ));
    }
    let x_dims = if x_view.sizes.is_empty() {
        vec![1]
    } else {
        x_view.sizes.clone()
    };
    let dim = wrap_dim(b, b.int_arg(1)?, x_view.sizes.len())?;
    check_indices(b, 2, x_dims[dim])?;
    let count = index_view.numel() as i64;
    let mut out_dims = x_dims.clone();
    out_dims[dim] = count;
    let idx = b.tensor(2)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &[count])?;
    let idx = b.broadcast_in_dim(idx, &out_dims, &[dim as i64]);
    let flat_index = flat_indices(b, &x_dims, &out_dims, dim, idx)?;
    let x = b.tensor(0)?;
    let flat = b.reshape(x, &[x_view.numel() as i64])?;
    let out = b.flat_gather(flat, flat_index);
    let final_dims = if x_view.sizes.is_empty() {
        vec![]
    } else {
        out_dims
    };
    let out = b.reshape(out, &final_dims)?;
    b.output(out)
}

fn gather(b: &mut Builder) -> Result<()> {
    let x_view = b.tensor_arg(0)?.view.clone();
    let index_view = b.tensor_arg(2)?.view.clone();
    let rank = x_view.sizes.len();
    let dim = wrap_dim(b, b.int_arg(1)?, rank)?;
    if index_view.numel() == 0 {
        // An empty index selects nothing, whatever its rank (as in ATen).
        let out = b.constant(Literal::Int(0), x_view.dtype, &index_view.sizes);
        return b.output(out);
    }
    // A 0-d tensor counts as 1-D here, as in ATen.
    let as_1d = |sizes: &[i64]| {
        if sizes.is_empty() {
            vec![1]
        } else {
            sizes.to_vec()
        }
    };
    let (x_dims, out_dims) = (as_1d(&x_view.sizes), as_1d(&index_view.sizes));
    if out_dims.len() != x_dims.len() {
        return Err(b.arg_error(
            2,
            format!("an index of rank {rank}"),
            format!("rank {}", index_view.sizes.len()),
        ));
    }
    for d in 0..x_dims.len() {
        if d != dim && out_dims[d] > x_dims[d] {
            return Err(b.arg_error(
                2,
                format!("size <= {} in dimension {d}", x_dims[d]),
                out_dims[d],
            ));
        }
    }
    check_indices(b, 2, x_dims[dim])?;
    let idx = b.tensor(2)?;
    let idx = b.convert(idx, DType::I64);
    let idx = b.reshape(idx, &out_dims)?;
    let flat_index = flat_indices(b, &x_dims, &out_dims, dim, idx)?;
    let x = b.tensor(0)?;
    let flat = b.reshape(x, &[x_view.numel() as i64])?;
    let out = b.flat_gather(flat, flat_index);
    let out = b.reshape(out, &index_view.sizes)?;
    b.output(out)
}

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
    let st = b.scalar_arg(2, work)?;
    let st = b.broadcast_to(st, &[n])?;
    let s = b.scalar_arg(0, work)?;
    let s = b.broadcast_to(s, &[n])?;
    let scaled = b.binary(BinaryOp::Mul, i, st)?;
    let out = b.binary(BinaryOp::Add, s, scaled)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// Uniform [0, 1) floats of `dtype` and `dims` from the generator argument.
pub(super) fn uniform01(
    b: &mut Builder,
    generator: usize,
    dtype: DType,
    dims: &[i64],
) -> Result<ValueId> {
    uniform_stream(b, generator, dtype, dims, 0)
}

/// A second uniform draw, independent of `uniform01`'s for the same
/// generator state.
pub(super) fn uniform01_second(
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
pub(super) fn box_muller(b: &mut Builder, u1: ValueId, u2: ValueId) -> Result<ValueId> {
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
fn float_destination(b: &Builder) -> Result<(DType, Vec<i64>)> {
    let view = &b.tensor_arg(0)?.view;
    if !is_float(view.dtype) {
        return Err(Error::invalid(
            format!("{}: self", b.op_name()),
            "a floating point tensor",
            view.dtype,
        ));
    }
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
    let work = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let u = uniform01(b, 3, dtype, &dims)?;
    let lo = b.scalar_arg(1, work)?;
    let lo = b.broadcast_to(lo, &dims)?;
    let hi = b.scalar_arg(2, work)?;
    let hi = b.broadcast_to(hi, &dims)?;
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
    let work = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let u1 = uniform01(b, 3, dtype, &dims)?;
    let u2 = uniform01_second(b, 3, dtype, &dims)?;
    let z = box_muller(b, u1, u2)?;
    let std = b.scalar_arg(2, work)?;
    let std = b.broadcast_to(std, &dims)?;
    let mean = b.scalar_arg(1, work)?;
    let mean = b.broadcast_to(mean, &dims)?;
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
    let hit = b.compare(crate::ir::CompareDir::Lt, u, p)?;
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
    let s = b.scalar_arg(2, dtype)?;
    let s = b.broadcast_to(s, &dims)?;
    let gm = b.binary(BinaryOp::Mul, g, m)?;
    let out = b.binary(BinaryOp::Mul, gm, s)?;
    b.output(out)
}

/// linspace(start, end, steps, *, out): ATen's two-sided formula (from the
/// start for the first half, from the end for the rest), in out's dtype.
fn linspace(b: &mut Builder) -> Result<()> {
    let steps = b.int_arg(2)?;
    if steps < 0 {
        return Err(b.arg_error(2, "steps >= 0", steps));
    }
    let dtype = b.tensor_arg(3)?.view.dtype;
    let work = if is_float(dtype) { dtype } else { DType::F64 };
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
    let e = b.scalar_input(Literal::Float(end), work);
    let e = b.broadcast_to(e, &n)?;
    let st = b.scalar_input(Literal::Float(step), work);
    let st = b.broadcast_to(st, &n)?;
    let from_start = b.binary(BinaryOp::Mul, i, st)?;
    let from_start = b.binary(BinaryOp::Add, s, from_start)?;
    let last = b.constant(Literal::Int(steps - 1), work, &n);
    let back = b.binary(BinaryOp::Sub, last, i)?;
    let from_end = b.binary(BinaryOp::Mul, back, st)?;
    let from_end = b.binary(BinaryOp::Sub, e, from_end)?;
    // The first half counts from start (all of it for one step).
    let half = b.constant(Literal::Int((steps / 2).max(1)), work, &n);
    let first_half = b.compare(crate::ir::CompareDir::Lt, i, half)?;
    let out = b.select(first_half, from_start, from_end)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// isinf / isposinf / isneginf (isfinite decomposes in ATen).
fn classify(b: &mut Builder) -> Result<()> {
    let name = b
        .op_name()
        .trim_start_matches("aten::")
        .split('.')
        .next()
        .unwrap_or("")
        .to_string();
    let x = b.tensor(0)?;
    let dims = b.dims(x);
    let dtype = b.dtype(x);
    if !is_float(dtype) {
        let out = b.constant(Literal::Bool(false), DType::Bool, &dims);
        return b.output(out);
    }
    let out = match name.as_str() {
        "isposinf" => {
            let inf = b.constant(Literal::Float(f64::INFINITY), dtype, &dims);
            b.compare(crate::ir::CompareDir::Eq, x, inf)?
        }
        "isneginf" => {
            let ninf = b.constant(Literal::Float(f64::NEG_INFINITY), dtype, &dims);
            b.compare(crate::ir::CompareDir::Eq, x, ninf)?
        }
        _ => {
            let inf = b.constant(Literal::Float(f64::INFINITY), dtype, &dims);
            let a = b.unary(UnaryOp::Abs, x);
            b.compare(crate::ir::CompareDir::Eq, a, inf)?
        }
    };
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op("aten::cat", cat),
        op("aten::cat.out", cat),
        op("aten::index_select", index_select),
        op("aten::index_select.out", index_select),
        op("aten::gather", gather),
        op("aten::gather.out", gather),
        op("aten::arange.start_out", arange),
        op("aten::linspace.out", linspace),
        op("aten::isinf", classify),
        op("aten::isposinf", classify),
        op("aten::isposinf.out", classify),
        op("aten::isneginf", classify),
        op("aten::isneginf.out", classify),
        op("aten::uniform_", uniform),
        op("aten::normal_", normal),
        op("aten::random_.from", |b| random(b, Some(1), Some(2), 3)),
        op("aten::random_.to", |b| random(b, None, Some(1), 2)),
        op("aten::random_", |b| random(b, None, None, 1)),
        op("aten::bernoulli_.float", |b| bernoulli(b, Some(1), 2, true)),
        op("aten::bernoulli_.Tensor", |b| {
            bernoulli(b, Some(1), 2, true)
        }),
        op("aten::bernoulli", |b| bernoulli(b, None, 1, false)),
        op("aten::bernoulli.p", |b| bernoulli(b, Some(1), 2, false)),
        op("aten::native_dropout_backward", dropout_backward),
    ]
}
