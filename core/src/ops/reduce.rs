//! Reductions over dims: sum/mean/prod (and nansum), amax/amin/aminmax,
//! max/min (with indices), argmax/argmin, any/all, count_nonzero,
//! var/std, logsumexp; and the cumulative sum and product.

use super::{
    accumulate_dtype, all_dims, at_least_1d, finish, is_float, is_integral, keep_dims,
    keepdim_shape, output_as, real_only, reduce_dims, reduce_extreme, reduced, reduced_shape,
    require_float, require_nonempty_dim, wrap_dim, wrap_dims, Arith, Form, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

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
    let out = b.convert(out, dtype);
    let out = keep_dims(b, out, &input.sizes, &dims, keepdim)?;
    b.output(out)
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
    let out = reduce_extreme(b, x, op, &dims)?;
    let out = keep_dims(b, out, &input.sizes, &dims, keepdim)?;
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
            (0, Dims::from([n]))
        }
    };
    require_nonempty_dim(b, dims.get(d).copied().unwrap_or(1), &input.sizes)?;
    let work_dims = at_least_1d(&dims);
    x = b.reshape(x, &work_dims)?;
    let (_, mut out) = extreme_and_index(b, x, op, d)?;
    if keepdim {
        let shape: Vec<i64> = if dim.is_none() {
            vec![1; input.sizes.len()]
        } else {
            keepdim_shape(&input.sizes, &[d as i64])
        };
        out = b.reshape(out, &shape)?;
    }
    b.output(out)
}

/// The extreme of `x` along `d` and the first index where it occurs; as in
/// torch, a NaN is the extreme of both kinds, so the first NaN wins.
fn extreme_and_index(
    b: &mut Builder,
    x: ValueId,
    op: ReduceOp,
    d: usize,
) -> Result<(ValueId, ValueId)> {
    let work = b.dims(x);
    let extreme = reduce_extreme(b, x, op, &[d as i64])?;
    let keep: Vec<i64> = (0..work.len() as i64).filter(|&k| k != d as i64).collect();
    let eb = b.broadcast_in_dim(extreme, &work, &keep);
    let hit = b.compare(CompareDir::Eq, x, eb)?;
    // A NaN never equals the (then NaN) extreme; where there is none, no
    // element is NaN and this adds nothing.
    let hit = if is_float(b.dtype(x)) {
        let nan = b.is_nan(x)?;
        b.binary(BinaryOp::Or, hit, nan)?
    } else {
        hit
    };
    let iota = b.iota(DType::I64, &work, d);
    let big = b.constant(Literal::Int(i64::MAX), DType::I64, &work);
    let candidates = b.select(hit, iota, big)?;
    let index = b.reduce(candidates, ReduceOp::Min, &[d as i64]);
    Ok((extreme, index))
}

/// var/std (and their `_mean` forms) with Bessel's `correction`; 16-bit
/// floats compute in float32 and round once, as ATen's CPU kernels do.
fn var_std(b: &mut Builder, std: bool, with_mean: bool) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    require_float(b, "input", view.dtype)?;
    let acc = accumulate_dtype(view.dtype);
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
    let x = b.convert(x, acc);
    let sum = b.reduce(x, ReduceOp::Sum, &dims);
    let n = b.constant(Literal::Int(count), acc, &b.dims(sum));
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
        acc,
        &b.dims(ss),
    );
    let mut v = b.binary(BinaryOp::Div, ss, denom)?;
    if std {
        v = b.unary(UnaryOp::Sqrt, v);
    }
    let v = b.convert(v, view.dtype);
    let v = keep_dims(b, v, &view.sizes, &dims, keepdim)?;
    b.output(v)?;
    if with_mean {
        let mean = b.convert(mean, view.dtype);
        let m = keep_dims(b, mean, &view.sizes, &dims, keepdim)?;
        b.output(m)?;
    }
    Ok(())
}

/// logsumexp(self, dim, keepdim), shifted by the max (0 where it is
/// infinite, so all -inf rows give -inf, not nan). A NaN the max skips
/// still reaches the sum, so a row holding one gives NaN, as in torch.
fn logsumexp(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    real_only(b, view.dtype)?;
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
    let absm = b.unary(UnaryOp::Abs, m);
    let finite = b.compare(CompareDir::Lt, absm, inf)?;
    let zero = b.constant(Literal::Int(0), dtype, &md);
    let shift = b.select(finite, m, zero)?;
    let keep: Vec<i64> = (0..view.sizes.len() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    let shift_b = b.broadcast_in_dim(shift, &view.sizes, &keep);
    let shifted = b.binary(BinaryOp::Sub, x, shift_b)?;
    let e = b.unary(UnaryOp::Exp, shifted);
    let s = b.reduce(e, ReduceOp::Sum, &dims);
    let l = b.unary(UnaryOp::Log, s);
    let out = b.binary(BinaryOp::Add, l, shift)?;
    let out = keep_dims(b, out, &view.sizes, &dims, keepdim)?;
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
    let out = reduce_extreme(b, x, op, &all_dims(view.sizes.len()))?;
    b.output(out)
}

/// max.dim/min.dim: (values, first index of each extreme).
fn extreme_dim(b: &mut Builder, op: ReduceOp) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
    let keepdim = b.bool_arg(2)?;
    let work = at_least_1d(&view.sizes);
    require_nonempty_dim(b, work[d], &view.sizes)?;
    let x = b.tensor(0)?;
    let x = b.reshape(x, &work)?;
    let (values, index) = extreme_and_index(b, x, op, d)?;
    output_as(b, &reduced_shape(&view.sizes, d, keepdim), &[values, index])
}

/// cumsum/cumprod(self, dim, *, dtype) as a reduce_window over the prefix.
fn cumulative(b: &mut Builder, op: ReduceOp, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = match b.opt_dtype_arg(2)? {
        Some(d) => d,
        None if is_integral(view.dtype, true) && form == Form::Functional => DType::I64,
        None => view.dtype,
    };
    let work = at_least_1d(&view.sizes);
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
    finish(b, form, out)
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
        Some(d) if !d.is_empty() => wrap_dims(b, &d, view.sizes.len())?,
        _ => all_dims(view.sizes.len()),
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
    let nan = b.is_nan(x)?;
    let zero = b.constant(Literal::Int(0), acc, &view.sizes);
    let x = b.select(nan, zero, x)?;
    let s = reduced(b, x, ReduceOp::Sum, &dims, keepdim, &view.sizes)?;
    let s = b.convert(s, dtype);
    b.output(s)
}

/// count_nonzero.dim_IntList(self, dim) / count_nonzero(self, dim?).
fn count_nonzero(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims: Vec<i64> = match b.arg(1) {
        Ok(Arg::None) | Err(_) => all_dims(view.sizes.len()),
        Ok(_) => {
            let d = b.int_list_arg(1)?;
            if d.is_empty() {
                all_dims(view.sizes.len())
            } else {
                wrap_dims(b, &d, view.sizes.len())?
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
        None => all_dims(view.sizes.len()),
    };
    let reduce: Vec<i64> = if view.sizes.is_empty() {
        vec![]
    } else {
        dims.clone()
    };
    let x = b.tensor(0)?;
    for op in [ReduceOp::Min, ReduceOp::Max] {
        let r = reduce_extreme(b, x, op, &reduce)?;
        let r = keep_dims(b, r, &view.sizes, &dims, keepdim)?;
        b.output(r)?;
    }
    Ok(())
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = vec![
        op!("aten::var.correction", var_std(false, false)),
        op!("aten::std.correction", var_std(true, false)),
        op!("aten::var_mean.correction", var_std(false, true)),
        op!("aten::std_mean.correction", var_std(true, true)),
        op!("aten::prod", prod(None)),
        op!("aten::prod.dim_int", prod(Some(1))),
        op!("aten::prod.int_out", prod(Some(1))),
        op!("aten::any", any_all(ReduceOp::Or, None)),
        op!("aten::any.dim", any_all(ReduceOp::Or, Some(1))),
        op!("aten::any.dims", any_all(ReduceOp::Or, Some(1))),
        op!("aten::all", any_all(ReduceOp::And, None)),
        op!("aten::all.dim", any_all(ReduceOp::And, Some(1))),
        op!("aten::all.dims", any_all(ReduceOp::And, Some(1))),
        op!("aten::max", extreme_all(ReduceOp::Max)),
        op!("aten::min", extreme_all(ReduceOp::Min)),
        op!("aten::max.dim", extreme_dim(ReduceOp::Max)),
        op!("aten::min.dim", extreme_dim(ReduceOp::Min)),
        op!("aten::sum", sum_mean(false, None, None, 1)),
        op!(
            "aten::sum.dim_IntList",
            sum_mean(false, Some(1), Some(2), 3)
        ),
        op!(
            "aten::sum.IntList_out",
            sum_mean(false, Some(1), Some(2), 3)
        ),
        op!("aten::mean", sum_mean(true, None, None, 1)),
        op!("aten::mean.dim", sum_mean(true, Some(1), Some(2), 3)),
        op!("aten::mean.out", sum_mean(true, Some(1), Some(2), 3)),
        op!("aten::count_nonzero", count_nonzero()),
        op!("aten::count_nonzero.dim_IntList", count_nonzero()),
    ];
    ops.extend(with_out!("aten::logsumexp", logsumexp()));
    ops.extend(with_out!("aten::amax", amax_amin(ReduceOp::Max)));
    ops.extend(with_out!("aten::amin", amax_amin(ReduceOp::Min)));
    ops.extend(with_out!("aten::argmax", arg_extreme(ReduceOp::Max)));
    ops.extend(with_out!("aten::argmin", arg_extreme(ReduceOp::Min)));
    ops.extend(with_out!("aten::nansum", nansum()));
    ops.extend(with_out!("aten::aminmax", aminmax()));
    ops.extend(forms!("aten::cumsum", cumulative(ReduceOp::Sum)));
    ops.extend(forms!("aten::cumprod", cumulative(ReduceOp::Prod)));
    ops
}
