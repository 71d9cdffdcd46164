//! Sorting and order statistics: sort, topk, kthvalue, median, nanmedian;
//! and binary search (bucketize, searchsorted).

use super::index::plane_positions;
use super::{
    at_least_1d, ensure, is_float, operand, output_as, reduced_shape, require_nonempty_dim,
    result_type, wrap_dim, Arith, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

/// sort(self, dim, descending) or sort.stable(self, *, stable, dim,
/// descending): (values, indices); the sort is always stable.
fn sort(b: &mut Builder, dim_index: usize) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let work = at_least_1d(&view.sizes);
    let d = wrap_dim(b, b.int_arg(dim_index)?, view.sizes.len())?;
    let descending = b.bool_arg(dim_index + 1)?;
    let (_, values, indices) = sorted(b, &work, d, descending)?;
    output_as(b, &view.sizes, &[values, indices])
}

/// Argument 0 as `work` dims, and its values and indices stably sorted
/// along `d`.
fn sorted(
    b: &mut Builder,
    work: &[i64],
    d: usize,
    descending: bool,
) -> Result<(ValueId, ValueId, ValueId)> {
    let x = b.tensor(0)?;
    let x = b.reshape(x, work)?;
    let iota = b.iota(DType::I64, work, d);
    let (values, indices) = b.sort(x, iota, d, descending);
    Ok((x, values, indices))
}

/// topk(self, k, dim, largest, sorted): the first k of a stable sort.
fn topk(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let work = at_least_1d(&view.sizes);
    let k = b.int_arg(1)?;
    let d = wrap_dim(b, b.int_arg(2)?, view.sizes.len())?;
    if k < 0 || k > work[d] {
        return Err(b.arg_error(1, format!("k in [0, {}]", work[d]), k));
    }
    let largest = b.bool_arg(3)?;
    let (_, values, indices) = sorted(b, &work, d, largest)?;
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
    output_as(b, &out_sizes, &[values, indices])
}

/// kthvalue(self, k, dim, keepdim) and median.dim(self, dim, keepdim):
/// (value, index) from a stable sort; median is the lower middle, or NaN at
/// the first NaN of a row that holds one, as in torch.
fn order_statistic(b: &mut Builder, median: bool) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let work = at_least_1d(&view.sizes);
    let (dim_index, keep_index) = if median { (1, 2) } else { (2, 3) };
    let d = wrap_dim(b, b.int_arg(dim_index)?, view.sizes.len())?;
    let n = work[d];
    let kth = if median {
        (n - 1) / 2
    } else {
        b.int_arg(1)? - 1
    };
    if kth < 0 || kth >= n {
        return Err(Error::invalid(
            format!("{}: k", b.op_name()),
            format!("k in [1, {n}]"),
            kth + 1,
        ));
    }
    let keepdim = b.bool_arg(keep_index)?;
    let (x, values, indices) = sorted(b, &work, d, false)?;
    let mut start = vec![0; work.len()];
    start[d] = kth;
    let mut limit = work.clone();
    limit[d] = kth + 1;
    let ones = vec![1; work.len()];
    let mut v = b.slice(values, &start, &limit, &ones);
    let mut i = b.slice(indices, &start, &limit, &ones);
    if median && is_float(view.dtype) {
        let nan = b.is_nan(x)?;
        let position = b.iota(DType::I64, &work, d);
        let big = b.constant(Literal::Int(i64::MAX), DType::I64, &work);
        let nan_position = b.select(nan, position, big)?;
        let picked = b.dims(v);
        let first_nan = b.reduce(nan_position, ReduceOp::Min, &[d as i64]);
        let first_nan = b.reshape(first_nan, &picked)?;
        let any_nan = b.reduce(nan, ReduceOp::Or, &[d as i64]);
        let any_nan = b.reshape(any_nan, &picked)?;
        let nan_value = b.float_like(f64::NAN, v);
        v = b.select(any_nan, nan_value, v)?;
        i = b.select(any_nan, first_nan, i)?;
    }
    output_as(b, &reduced_shape(&view.sizes, d, keepdim), &[v, i])
}

/// median(self): the lower middle of all elements (NaN if any).
fn median_all(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let n = view.numel() as i64;
    if n == 0 {
        return Err(Error::invalid(
            "aten::median: input",
            "a non-empty tensor",
            "an empty tensor",
        ));
    }
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[n])?;
    let iota = b.iota(DType::I64, &[n], 0);
    let (values, _) = b.sort(x, iota, 0, false);
    let m = (n - 1) / 2;
    let v = b.slice(values, &[m], &[m + 1], &[1]);
    let v = b.reshape(v, &[])?;
    // NaN sorts last: a NaN anywhere makes the median NaN, as in torch.
    let last = b.slice(values, &[n - 1], &[n], &[1]);
    let last = b.reshape(last, &[])?;
    let nan = b.compare(CompareDir::Ne, last, last)?;
    let out = b.select(nan, last, v)?;
    b.output(out)
}

/// nanmedian(self) and nanmedian.dim(self, dim, keepdim): the lower middle
/// of the non-NaN values (NaN when a row has none), from a sort that puts
/// NaN last.
fn nanmedian(b: &mut Builder, with_dim: bool) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let (work, d, keepdim) = if with_dim {
        let work = at_least_1d(&view.sizes);
        let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
        (work, d, b.bool_arg(2)?)
    } else {
        (vec![view.numel() as i64], 0, false)
    };
    let n = work[d];
    require_nonempty_dim(b, n, &view.sizes)?;
    let (x, values, indices) = sorted(b, &work, d, false)?;
    // Per row: the count of non-NaN values, and the lower middle of them.
    let not_nan = b.compare(CompareDir::Eq, x, x)?;
    let count = b.convert(not_nan, DType::I64);
    let count = b.reduce(count, ReduceOp::Sum, &[d as i64]);
    let rest: Vec<i64> = (0..work.len() as i64).filter(|&a| a != d as i64).collect();
    let one = b.constant(Literal::Int(1), DType::I64, &b.dims(count));
    let two = b.constant(Literal::Int(2), DType::I64, &b.dims(count));
    let cm1 = b.binary(BinaryOp::Sub, count, one)?;
    let zero = b.constant(Literal::Int(0), DType::I64, &b.dims(count));
    let cm1 = b.binary(BinaryOp::Max, cm1, zero)?;
    let middle = b.binary(BinaryOp::Div, cm1, two)?;
    let middle = b.broadcast_in_dim(middle, &work, &rest);
    let position = b.iota(DType::I64, &work, d);
    let at = b.compare(CompareDir::Eq, position, middle)?;
    // Exactly one position per row is picked; summing it against zeros
    // elsewhere extracts its value, and a min extracts its index.
    let big = b.constant(Literal::Int(i64::MAX), DType::I64, &work);
    let picked_index = b.select(at, indices, big)?;
    let index = b.reduce(picked_index, ReduceOp::Min, &[d as i64]);
    let zeros = b.constant(Literal::Int(0), view.dtype, &work);
    let masked = b.select(at, values, zeros)?;
    let value = b.reduce(masked, ReduceOp::Sum, &[d as i64]);
    let no_values = b.compare(CompareDir::Eq, count, zero)?;
    let row_nan = b.constant(Literal::Float(f64::NAN), view.dtype, &b.dims(value));
    let value = b.select(no_values, row_nan, value)?;
    if !with_dim {
        let value = b.reshape(value, &[])?;
        return b.output(value);
    }
    let index = b.select(no_values, zero, index)?;
    output_as(b, &reduced_shape(&view.sizes, d, keepdim), &[value, index])
}

/// bucketize.Tensor(self, boundaries, *, out_int32, right) and
/// searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side,
/// sorter?): how many boundaries lie below each value (left) or at or below
/// it (right), per row of an N-D sequence. Counted as boundaries not at or
/// above (not above) the value, the test ATen's binary search makes, so a
/// NaN value lands after every boundary.
fn bucket(b: &mut Builder, searchsorted: bool) -> Result<()> {
    let (values_index, seq_index) = if searchsorted { (1, 0) } else { (0, 1) };
    // bucketize(self, boundaries, *, out_int32, right); searchsorted(seq,
    // self, *, out_int32, right, side?, sorter?).
    let right =
        b.bool_arg(3)? || (searchsorted && matches!(b.arg(4), Ok(Arg::Str(s)) if s == "right"));
    let out_int32 = b.bool_arg(2)?;
    let dtype = result_type(b, &[values_index, seq_index])?;
    let v = operand(b, values_index, dtype)?;
    let mut s = operand(b, seq_index, dtype)?;
    let rank = b.dims(s).len();
    let what = if searchsorted {
        "sorted_sequence"
    } else {
        "boundaries"
    };
    ensure(
        b,
        rank >= 1,
        what,
        "a tensor of at least 1 dimension",
        "a 0-d tensor",
    )?;
    if searchsorted && b.opt_tensor_arg(5)?.is_some() {
        // The sequence in sorted order: gather along its last dim.
        let sdims = b.dims(s);
        let m = *sdims.last().unwrap_or(&1);
        let rows: i64 = sdims[..sdims.len().saturating_sub(1)].iter().product();
        let flat = plane_positions(b, 5, rows, m, m)?;
        let seq = b.reshape(s, &[rows * m])?;
        let sorted = b.flat_gather(seq, flat);
        s = b.reshape(sorted, &sdims)?;
    }
    let vdims = b.dims(v);
    let sdims = b.dims(s);
    let m = *sdims.last().unwrap_or(&1);
    let mut full = vdims.clone();
    full.push(m);
    let vb = b.broadcast_in_dim(v, &full, &(0..vdims.len() as i64).collect::<Vec<_>>());
    let sb = if sdims.len() == 1 {
        b.broadcast_in_dim(s, &full, &[vdims.len() as i64])
    } else {
        if sdims[..sdims.len() - 1] != vdims[..vdims.len().saturating_sub(1)] {
            return Err(b.arg_error(
                seq_index,
                "a 1-D sequence or one whose leading dims match the values'",
                format!("{sdims:?}"),
            ));
        }
        let mut keep: Vec<i64> = (0..sdims.len() as i64 - 1).collect();
        keep.push(vdims.len() as i64);
        b.broadcast_in_dim(s, &full, &keep)
    };
    let above = b.compare(
        if right {
            CompareDir::Gt
        } else {
            CompareDir::Ge
        },
        sb,
        vb,
    )?;
    let below = b.unary(UnaryOp::Not, above);
    let count = b.convert(below, DType::I64);
    let out = b.reduce(count, ReduceOp::Sum, &[vdims.len() as i64]);
    let out = if out_int32 {
        b.convert(out, DType::I32)
    } else {
        out
    };
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = vec![
        op!("aten::sort", sort(1)),
        op!("aten::sort.stable", sort(2)),
        op!("aten::topk", topk()),
        op!("aten::median", median_all()),
        op!("aten::nanmedian", nanmedian(false)),
    ];
    ops.extend(aliases!(
        ["aten::kthvalue", "aten::kthvalue.values"],
        order_statistic(false)
    ));
    ops.extend(aliases!(
        ["aten::median.dim", "aten::median.dim_values"],
        order_statistic(true)
    ));
    ops.extend(aliases!(
        ["aten::nanmedian.dim", "aten::nanmedian.dim_values"],
        nanmedian(true)
    ));
    ops.extend(out_overloads!("aten::bucketize", ["Tensor"], bucket(false)));
    ops.extend(out_overloads!(
        "aten::searchsorted",
        ["Tensor"],
        bucket(true)
    ));
    ops
}
