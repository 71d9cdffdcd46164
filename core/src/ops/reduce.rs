//! Reductions: sum, mean, amax, argmax.

use super::{is_float, is_integral, op, wrap_dim, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, ValueId};

/// The reduced dims from an optional dim list (None or [] = all dims).
fn reduce_dims(b: &Builder, index: usize, rank: usize) -> Result<Vec<i64>> {
    let dims = match b.arg(index).ok() {
        None | Some(Arg::None) => None,
        Some(_) => Some(b.int_list_arg(index)?),
    };
    match dims {
        Some(d) if !d.is_empty() => {
            let mut out: Vec<i64> = d
                .iter()
                .map(|&x| wrap_dim(b, x, rank).map(|v| v as i64))
                .collect::<Result<_>>()?;
            out.sort();
            out.dedup();
            // A 0-d tensor accepts dim 0 or -1 and has nothing to reduce.
            if rank == 0 {
                out.clear();
            }
            Ok(out)
        }
        _ => Ok((0..rank as i64).collect()),
    }
}

/// Re-inserts reduced dims as size 1.
fn keep_dims(
    b: &mut Builder,
    value: ValueId,
    input_dims: &[i64],
    reduced: &[i64],
) -> Result<ValueId> {
    let shape: Vec<i64> = input_dims
        .iter()
        .enumerate()
        .map(|(d, &s)| if reduced.contains(&(d as i64)) { 1 } else { s })
        .collect();
    b.reshape(value, &shape)
}

/// sum/mean over `dim_index` (absent: all dims), `keepdim_index`, `dtype_index`.
fn sum_mean(
    b: &mut Builder,
    mean: bool,
    dim_index: Option<usize>,
    keepdim_index: Option<usize>,
    dtype_index: usize,
) -> Result<()> {
    let input = b.tensor_arg(0)?.view.clone();
    let requested = b.opt_dtype_arg(dtype_index)?;
    let dtype = match requested {
        Some(d) => d,
        None if is_integral(input.dtype, true) && !mean => DType::I64,
        None => input.dtype,
    };
    if mean && !is_float(dtype) && !matches!(dtype, DType::C64 | DType::C128) {
        return Err(Error::invalid(
            format!("{}: dtype", b.op_name()),
            "a floating point or complex dtype (mean cannot infer one for integers)",
            dtype,
        ));
    }
    let rank = input.sizes.len();
    let dims = match dim_index {
        Some(i) => reduce_dims(b, i, rank)?,
        None => (0..rank as i64).collect(),
    };
    let keepdim = match keepdim_index {
        Some(i) => b.bool_arg(i)?,
        None => false,
    };
    // 16-bit floats accumulate in float32, as ATen's CPU kernels do.
    let acc = accumulate_dtype(dtype);
    let x = b.tensor(0)?;
    let x = b.convert(x, acc);
    let mut out = b.reduce(x, ReduceOp::Sum, &dims);
    if mean {
        let count: i64 = dims.iter().map(|&d| input.sizes[d as usize]).product();
        let n = b.constant(Literal::Int(count), acc, &b.dims(out));
        out = b.binary(BinaryOp::Div, out, n)?;
    }
    let mut out = b.convert(out, dtype);
    if keepdim {
        out = keep_dims(b, out, &input.sizes, &dims)?;
    }
    b.output(out)
}

/// The sizes after reducing dim `d` of `sizes`: kept as 1 with keepdim,
/// dropped otherwise.
pub(super) fn reduced_shape(sizes: &[i64], d: usize, keepdim: bool) -> Vec<i64> {
    if keepdim {
        sizes
            .iter()
            .enumerate()
            .map(|(k, &s)| if k == d { 1 } else { s })
            .collect()
    } else {
        sizes
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != d)
            .map(|(_, &s)| s)
            .collect()
    }
}

/// The dtype sums accumulate in: float32 for 16-bit floats.
pub(super) fn accumulate_dtype(dtype: DType) -> DType {
    if matches!(dtype, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dtype
    }
}

fn amax_amin(b: &mut Builder, op: ReduceOp) -> Result<()> {
    let input = b.tensor_arg(0)?.view.clone();
    let dims = reduce_dims(b, 1, input.sizes.len())?;
    if dims
        .iter()
        .any(|&d| input.sizes.get(d as usize) == Some(&0))
    {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a non-empty reduced dimension",
            format!("sizes {:?}", input.sizes),
        ));
    }
    let keepdim = b.num_args() > 2 && b.bool_arg(2)?;
    let x = b.tensor(0)?;
    let mut out = b.reduce(x, op, &dims);
    if keepdim {
        out = keep_dims(b, out, &input.sizes, &dims)?;
    }
    b.output(out)
}

/// The index of the first maximum (or minimum) along one dim, or of the
/// flattened tensor when `dim` is None.
fn arg_extreme(b: &mut Builder, op: ReduceOp) -> Result<()> {
    let input = b.tensor_arg(0)?.view.clone();
    let dim = b.opt_int_arg(1)?;
    let keepdim = b.num_args() > 2 && b.bool_arg(2)?;
    let mut x = b.tensor(0)?;
    let (d, dims) = match dim {
        Some(d) => (wrap_dim(b, d, input.sizes.len())?, input.sizes.clone()),
        None => {
            let n = input.numel() as i64;
            x = b.reshape(x, &[n])?;
            (0, vec![n])
        }
    };
    if dims.get(d).copied().unwrap_or(1) == 0 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a non-empty dimension",
            format!("sizes {:?}", input.sizes),
        ));
    }
    let work_dims = if dims.is_empty() {
        vec![1]
    } else {
        dims.clone()
    };
    x = b.reshape(x, &work_dims)?;
    let extreme = b.reduce(x, op, &[d as i64]);
    let keep: Vec<i64> = (0..work_dims.len() as i64)
        .filter(|&k| k != d as i64)
        .collect();
    let extreme = b.broadcast_in_dim(extreme, &work_dims, &keep);
    let hit = b.compare(CompareDir::Eq, x, extreme)?;
    let iota = b.iota(DType::I64, &work_dims, d);
    let big = b.constant(Literal::Int(i64::MAX), DType::I64, &work_dims);
    let candidates = b.select(hit, iota, big)?;
    let mut out = b.reduce(candidates, ReduceOp::Min, &[d as i64]);
    if keepdim {
        let shape: Vec<i64> = if dim.is_none() {
            vec![1; input.sizes.len()]
        } else {
            input
                .sizes
                .iter()
                .enumerate()
                .map(|(k, &s)| if k == d { 1 } else { s })
                .collect()
        };
        out = b.reshape(out, &shape)?;
    }
    b.output(out)
}

/// Reads `x` (argument 0) as `dtype` with dims `dims` reduced; returns the
/// reduced value (keepdim applied) and the element count per result.
fn reduced(
    b: &mut Builder,
    x: ValueId,
    op: ReduceOp,
    dims: &[i64],
    keepdim: bool,
    input: &[i64],
) -> Result<ValueId> {
    let out = b.reduce(x, op, dims);
    if keepdim {
        keep_dims(b, out, input, dims)
    } else {
        Ok(out)
    }
}

/// var/std (and their `_mean` forms) with Bessel's `correction`.
fn var_std(b: &mut Builder, std: bool, with_mean: bool) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    if !is_float(view.dtype) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a floating point tensor",
            view.dtype,
        ));
    }
    let dims = reduce_dims(b, 1, view.sizes.len())?;
    let correction = match b.arg(2) {
        Ok(Arg::None) | Err(_) => 1.0,
        Ok(_) => b.float_arg(2)?,
    };
    let keepdim = b.bool_arg(3)?;
    let count: i64 = dims
        .iter()
        .map(|&d| view.sizes.get(d as usize).copied().unwrap_or(1))
        .product();
    let x = b.tensor(0)?;
    let sum = b.reduce(x, ReduceOp::Sum, &dims);
    let n = b.constant(Literal::Int(count), view.dtype, &b.dims(sum));
    let mean = b.binary(BinaryOp::Div, sum, n)?;
    let keep: Vec<i64> = (0..view.sizes.len() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    let mean_b = b.broadcast_in_dim(mean, &view.sizes, &keep);
    let centered = b.binary(BinaryOp::Sub, x, mean_b)?;
    let sq = b.binary(BinaryOp::Mul, centered, centered)?;
    let ss = b.reduce(sq, ReduceOp::Sum, &dims);
    // Division by max(0, n - correction), as ATen does (0 gives inf/nan).
    let denom = b.constant(
        Literal::Float((count as f64 - correction).max(0.0)),
        view.dtype,
        &b.dims(ss),
    );
    let mut v = b.binary(BinaryOp::Div, ss, denom)?;
    if std {
        v = b.unary(crate::ir::UnaryOp::Sqrt, v);
    }
    let v = if keepdim {
        keep_dims(b, v, &view.sizes, &dims)?
    } else {
        v
    };
    b.output(v)?;
    if with_mean {
        let m = if keepdim {
            keep_dims(b, mean, &view.sizes, &dims)?
        } else {
            mean
        };
        b.output(m)?;
    }
    Ok(())
}

/// logsumexp(self, dim, keepdim), shifted by the max (0 where it is
/// infinite, so all -inf rows give -inf, not nan).
fn logsumexp(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = if is_float(view.dtype) {
        view.dtype
    } else {
        DType::F32
    };
    let dims = reduce_dims(b, 1, view.sizes.len())?;
    let keepdim = b.bool_arg(2)?;
    let x = b.tensor(0)?;
    let x = b.convert(x, dtype);
    let m = b.reduce(x, ReduceOp::Max, &dims);
    let md = b.dims(m);
    let inf = b.constant(Literal::Float(f64::INFINITY), dtype, &md);
    let absm = b.unary(crate::ir::UnaryOp::Abs, m);
    let finite = b.compare(CompareDir::Lt, absm, inf)?;
    let zero = b.constant(Literal::Int(0), dtype, &md);
    let shift = b.select(finite, m, zero)?;
    let keep: Vec<i64> = (0..view.sizes.len() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    let shift_b = b.broadcast_in_dim(shift, &view.sizes, &keep);
    let shifted = b.binary(BinaryOp::Sub, x, shift_b)?;
    let e = b.unary(crate::ir::UnaryOp::Exp, shifted);
    let s = b.reduce(e, ReduceOp::Sum, &dims);
    let l = b.unary(crate::ir::UnaryOp::Log, s);
    let out = b.binary(BinaryOp::Add, l, shift)?;
    let out = if keepdim {
        keep_dims(b, out, &view.sizes, &dims)?
    } else {
        out
    };
    b.output(out)
}

/// prod over all dims (`dim_index` None) or one dim.
fn prod(b: &mut Builder, dim_index: Option<usize>) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype_index = if dim_index.is_some() { 3 } else { 1 };
    let dtype = match b.opt_dtype_arg(dtype_index)? {
        Some(d) => d,
        None if is_integral(view.dtype, true) => DType::I64,
        None => view.dtype,
    };
    let (dims, keepdim) = match dim_index {
        Some(i) => (
            vec![wrap_dim(b, b.int_arg(i)?, view.sizes.len())? as i64],
            b.bool_arg(i + 1)?,
        ),
        None => ((0..view.sizes.len() as i64).collect(), false),
    };
    // A 0-d tensor has nothing to reduce.
    let dims = if view.sizes.is_empty() {
        Vec::new()
    } else {
        dims
    };
    let x = b.tensor(0)?;
    let x = b.convert(x, dtype);
    let out = reduced(b, x, ReduceOp::Prod, &dims, keepdim, &view.sizes)?;
    b.output(out)
}

/// any/all over all dims, one dim (`dims_index` holding an int) or a list.
fn any_all(b: &mut Builder, op: ReduceOp, dims_index: Option<usize>) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (dims, keepdim) = match dims_index {
        Some(i) => (reduce_dims(b, i, view.sizes.len())?, b.bool_arg(i + 1)?),
        None => ((0..view.sizes.len() as i64).collect(), false),
    };
    let x = b.tensor(0)?;
    let x = b.convert(x, DType::Bool);
    let out = reduced(b, x, op, &dims, keepdim, &view.sizes)?;
    // uint8 inputs keep their dtype, as in ATen.
    let out = if view.dtype == DType::U8 {
        b.convert(out, DType::U8)
    } else {
        out
    };
    b.output(out)
}

/// max()/min() of all elements.
fn extreme_all(b: &mut Builder, op: ReduceOp) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    if view.numel() == 0 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a non-empty tensor",
            "an empty tensor",
        ));
    }
    let x = b.tensor(0)?;
    let out = b.reduce(x, op, &(0..view.sizes.len() as i64).collect::<Vec<_>>());
    b.output(out)
}

/// max.dim/min.dim: (values, first index of each extreme).
fn extreme_dim(b: &mut Builder, op: ReduceOp) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let keepdim = b.bool_arg(2)?;
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    if work[d] == 0 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a non-empty dimension",
            format!("sizes {:?}", view.sizes),
        ));
    }
    let x = b.tensor(0)?;
    let x = b.reshape(x, &work)?;
    let values = b.reduce(x, op, &[d as i64]);
    let keep: Vec<i64> = (0..work.len() as i64).filter(|&k| k != d as i64).collect();
    let vb = b.broadcast_in_dim(values, &work, &keep);
    let hit = b.compare(CompareDir::Eq, x, vb)?;
    let iota = b.iota(DType::I64, &work, d);
    let big = b.constant(Literal::Int(i64::MAX), DType::I64, &work);
    let candidates = b.select(hit, iota, big)?;
    let index = b.reduce(candidates, ReduceOp::Min, &[d as i64]);
    let shape = reduced_shape(&view.sizes, d, keepdim);
    let values = b.reshape(values, &shape)?;
    let index = b.reshape(index, &shape)?;
    b.output(values)?;
    b.output(index)
}

/// linalg_vector_norm(self, ord, dim?, keepdim, *, dtype?).
fn vector_norm(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = b.opt_dtype_arg(4)?.unwrap_or(view.dtype);
    if !is_float(dtype) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a floating point tensor",
            dtype,
        ));
    }
    let ord = b.float_arg(1)?;
    let dims = reduce_dims(b, 2, view.sizes.len())?;
    let keepdim = b.bool_arg(3)?;
    let x = b.tensor(0)?;
    let x = b.convert(x, dtype);
    let a = b.unary(crate::ir::UnaryOp::Abs, x);
    let out = if ord == f64::INFINITY {
        reduced(b, a, ReduceOp::Max, &dims, keepdim, &view.sizes)?
    } else if ord == f64::NEG_INFINITY {
        reduced(b, a, ReduceOp::Min, &dims, keepdim, &view.sizes)?
    } else if ord == 0.0 {
        let zero = b.constant(Literal::Int(0), dtype, &view.sizes);
        let nz = b.compare(CompareDir::Ne, a, zero)?;
        let nz = b.convert(nz, dtype);
        reduced(b, nz, ReduceOp::Sum, &dims, keepdim, &view.sizes)?
    } else if ord == 1.0 {
        reduced(b, a, ReduceOp::Sum, &dims, keepdim, &view.sizes)?
    } else if ord == 2.0 {
        let sq = b.binary(BinaryOp::Mul, a, a)?;
        let s = reduced(b, sq, ReduceOp::Sum, &dims, keepdim, &view.sizes)?;
        b.unary(crate::ir::UnaryOp::Sqrt, s)
    } else {
        let p = b.scalar_arg(1, dtype)?;
        let pb = b.broadcast_to(p, &view.sizes)?;
        let powered = b.binary(BinaryOp::Pow, a, pb)?;
        let s = reduced(b, powered, ReduceOp::Sum, &dims, keepdim, &view.sizes)?;
        let sd = b.dims(s);
        let one = b.constant(Literal::Int(1), dtype, &sd);
        let pb = b.broadcast_to(p, &sd)?;
        let inv = b.binary(BinaryOp::Div, one, pb)?;
        b.binary(BinaryOp::Pow, s, inv)?
    };
    b.output(out)
}

/// cumsum/cumprod(self, dim, *, dtype) as a reduce_window over the prefix.
fn cumulative(b: &mut Builder, op: ReduceOp, form: super::Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = match b.opt_dtype_arg(2)? {
        Some(d) => d,
        None if is_integral(view.dtype, true) && form == super::Form::Functional => DType::I64,
        None => view.dtype,
    };
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    // 16-bit floats accumulate in float32, as ATen does.
    let acc = accumulate_dtype(dtype);
    let x = b.tensor(0)?;
    let x = b.convert(x, acc);
    let x = b.reshape(x, &work)?;
    let n = work[d];
    let window: Vec<i64> = (0..work.len())
        .map(|k| if k == d { n.max(1) } else { 1 })
        .collect();
    let padding: Vec<(i64, i64)> = (0..work.len())
        .map(|k| if k == d { ((n - 1).max(0), 0) } else { (0, 0) })
        .collect();
    let out = b.reduce_window(x, op, &window, &vec![1; work.len()], &padding, &work);
    let out = b.convert(out, dtype);
    let out = b.reshape(out, &view.sizes)?;
    super::finish(b, form, out)
}

/// sort(self, dim, descending) or sort.stable(self, *, stable, dim,
/// descending): (values, indices); the sort is always stable.
fn sort(b: &mut Builder, dim_index: usize) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let d = wrap_dim(b, b.int_arg(dim_index)?, view.sizes.len())?;
    let descending = b.bool_arg(dim_index + 1)?;
    let x = b.tensor(0)?;
    let x = b.reshape(x, &work)?;
    let iota = b.iota(DType::I64, &work, d);
    let (values, indices) = b.sort(x, iota, d, descending);
    let values = b.reshape(values, &view.sizes)?;
    let indices = b.reshape(indices, &view.sizes)?;
    b.output(values)?;
    b.output(indices)
}

/// topk(self, k, dim, largest, sorted): the first k of a stable sort.
fn topk(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
    let k = b.int_arg(1)?;
    let d = wrap_dim(b, b.int_arg(2)?, view.sizes.len())?;
    if k < 0 || k > work[d] {
        return Err(b.arg_error(1, format!("k in [0, {}]", work[d]), k));
    }
    let largest = b.bool_arg(3)?;
    let x = b.tensor(0)?;
    let x = b.reshape(x, &work)?;
    let iota = b.iota(DType::I64, &work, d);
    let (values, indices) = b.sort(x, iota, d, largest);
    let limit: Vec<i64> = work
        .iter()
        .enumerate()
        .map(|(i, &s)| if i == d { k } else { s })
        .collect();
    let zeros = vec![0; work.len()];
    let ones = vec![1; work.len()];
    let values = b.slice(values, &zeros, &limit, &ones);
    let indices = b.slice(indices, &zeros, &limit, &ones);
    let out_sizes: Vec<i64> = if view.sizes.is_empty() { vec![] } else { limit };
    let values = b.reshape(values, &out_sizes)?;
    let indices = b.reshape(indices, &out_sizes)?;
    b.output(values)?;
    b.output(indices)
}

pub(super) fn ops() -> Vec<OpDef> {
    use super::Form::{Functional as F, InPlace as I};
    vec![
        op("aten::var.correction", |b| var_std(b, false, false)),
        op("aten::std.correction", |b| var_std(b, true, false)),
        op("aten::var_mean.correction", |b| var_std(b, false, true)),
        op("aten::std_mean.correction", |b| var_std(b, true, true)),
        op("aten::logsumexp", logsumexp),
        op("aten::logsumexp.out", logsumexp),
        op("aten::prod", |b| prod(b, None)),
        op("aten::prod.dim_int", |b| prod(b, Some(1))),
        op("aten::prod.int_out", |b| prod(b, Some(1))),
        op("aten::any", |b| any_all(b, ReduceOp::Or, None)),
        op("aten::any.dim", |b| any_all(b, ReduceOp::Or, Some(1))),
        op("aten::any.dims", |b| any_all(b, ReduceOp::Or, Some(1))),
        op("aten::all", |b| any_all(b, ReduceOp::And, None)),
        op("aten::all.dim", |b| any_all(b, ReduceOp::And, Some(1))),
        op("aten::all.dims", |b| any_all(b, ReduceOp::And, Some(1))),
        op("aten::max", |b| extreme_all(b, ReduceOp::Max)),
        op("aten::min", |b| extreme_all(b, ReduceOp::Min)),
        op("aten::max.dim", |b| extreme_dim(b, ReduceOp::Max)),
        op("aten::min.dim", |b| extreme_dim(b, ReduceOp::Min)),
        op("aten::linalg_vector_norm", vector_norm),
        op("aten::linalg_vector_norm.out", vector_norm),
        op("aten::cumsum", |b| cumulative(b, ReduceOp::Sum, F)),
        op("aten::cumsum.out", |b| cumulative(b, ReduceOp::Sum, F)),
        op("aten::cumsum_", |b| cumulative(b, ReduceOp::Sum, I)),
        op("aten::cumprod", |b| cumulative(b, ReduceOp::Prod, F)),
        op("aten::cumprod.out", |b| cumulative(b, ReduceOp::Prod, F)),
        op("aten::cumprod_", |b| cumulative(b, ReduceOp::Prod, I)),
        op("aten::sort", |b| sort(b, 1)),
        op("aten::sort.stable", |b| sort(b, 2)),
        op("aten::topk", topk),
        op("aten::sum", |b| sum_mean(b, false, None, None, 1)),
        op("aten::sum.dim_IntList", |b| {
            sum_mean(b, false, Some(1), Some(2), 3)
        }),
        op("aten::sum.IntList_out", |b| {
            sum_mean(b, false, Some(1), Some(2), 3)
        }),
        op("aten::mean", |b| sum_mean(b, true, None, None, 1)),
        op("aten::mean.dim", |b| sum_mean(b, true, Some(1), Some(2), 3)),
        op("aten::mean.out", |b| sum_mean(b, true, Some(1), Some(2), 3)),
        op("aten::amax", |b| amax_amin(b, ReduceOp::Max)),
        op("aten::amax.out", |b| amax_amin(b, ReduceOp::Max)),
        op("aten::amin", |b| amax_amin(b, ReduceOp::Min)),
        op("aten::amin.out", |b| amax_amin(b, ReduceOp::Min)),
        op("aten::argmax", |b| arg_extreme(b, ReduceOp::Max)),
        op("aten::argmax.out", |b| arg_extreme(b, ReduceOp::Max)),
        op("aten::argmin", |b| arg_extreme(b, ReduceOp::Min)),
        op("aten::argmin.out", |b| arg_extreme(b, ReduceOp::Min)),
    ]
}
