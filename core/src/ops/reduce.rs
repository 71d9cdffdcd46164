//! Reductions: sum, mean, amax, argmax.

use super::{is_float, is_integral, op, wrap_dim, OpDef};
use crate::dtype::DType;
use crate::engine::{Arg, Builder};
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
    let x = b.tensor(0)?;
    let x = b.convert(x, dtype);
    let mut out = b.reduce(x, ReduceOp::Sum, &dims);
    if mean {
        let count: i64 = dims.iter().map(|&d| input.sizes[d as usize]).product();
        let n = b.constant(Literal::Int(count), dtype, &b.dims(out));
        out = b.binary(BinaryOp::Div, out, n)?;
    }
    if keepdim {
        out = keep_dims(b, out, &input.sizes, &dims)?;
    }
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

pub(super) fn ops() -> Vec<OpDef> {
    vec![
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
