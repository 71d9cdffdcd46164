//! Shape ops that move data: cat, flip, roll, channel_shuffle, and the
//! triangular masks tril/triu.

use super::{finish, promote_types, wrap_dim, wrap_dims, Form, OpDef};
use crate::builder::{Builder, TensorArg};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal};

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

/// tril (`lower`) / triu(self, diagonal) on the last two dims.
fn triangle(b: &mut Builder, lower: bool, form: Form) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let r = view.sizes.len();
    if r < 2 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "at least 2 dimensions",
            format!("{:?}", view.sizes),
        ));
    }
    let k = b.int_arg(1)?;
    let x = b.tensor(0)?;
    let row = b.iota(DType::I64, &view.sizes, r - 2);
    let col = b.iota(DType::I64, &view.sizes, r - 1);
    let diff = b.binary(BinaryOp::Sub, col, row)?;
    let kv = b.constant(Literal::Int(k), DType::I64, &view.sizes);
    let keep = b.compare(
        if lower {
            CompareDir::Le
        } else {
            CompareDir::Ge
        },
        diff,
        kv,
    )?;
    let zero = b.constant(Literal::Int(0), view.dtype, &view.sizes);
    let out = b.select(keep, x, zero)?;
    finish(b, form, out)
}

fn flip(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dims = b.int_list_arg(1)?;
    let mut wrapped = wrap_dims(b, &dims, view.sizes.len())?;
    wrapped.sort();
    wrapped.dedup();
    let x = b.tensor(0)?;
    let out = if view.sizes.is_empty() {
        x
    } else {
        b.reverse(x, &wrapped)
    };
    b.output(out)
}

/// roll(self, shifts, dims): with no dims, rolls the flattened tensor.
fn roll(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let shifts = b.int_list_arg(1)?;
    let dims = b.int_list_arg(2).unwrap_or_default();
    let mut x = b.tensor(0)?;
    let (work, pairs): (Vec<i64>, Vec<(i64, usize)>) = if dims.is_empty() {
        if shifts.len() != 1 {
            return Err(b.arg_error(1, "one shift when dims is empty", shifts.len()));
        }
        (vec![view.numel() as i64], vec![(shifts[0], 0)])
    } else {
        if shifts.len() != dims.len() {
            return Err(b.arg_error(
                1,
                format!("{} shifts (one per dim)", dims.len()),
                shifts.len(),
            ));
        }
        let pairs = shifts
            .iter()
            .zip(&dims)
            .map(|(&s, &d)| wrap_dim(b, d, view.sizes.len()).map(|d| (s, d)))
            .collect::<Result<_>>()?;
        (view.sizes.to_vec(), pairs)
    };
    x = b.reshape(x, &work)?;
    for (shift, d) in pairs {
        let n = work[d];
        if n == 0 {
            continue;
        }
        let s = shift.rem_euclid(n);
        if s == 0 {
            continue;
        }
        let zeros = vec![0; work.len()];
        let ones = vec![1; work.len()];
        let mut tail_start = zeros.clone();
        tail_start[d] = n - s;
        let mut head_limit = work.clone();
        head_limit[d] = n - s;
        let tail = b.slice(x, &tail_start, &work, &ones);
        let head = b.slice(x, &zeros, &head_limit, &ones);
        x = b.concat(&[tail, head], d)?;
    }
    let out = b.reshape(x, &view.sizes)?;
    b.output(out)
}

/// channel_shuffle(self, groups): [N, g, C/g, ...] → [N, C/g, g, ...].
fn channel_shuffle(b: &mut Builder) -> Result<()> {
    let x = b.tensor(0)?;
    let dims = b.dims(x);
    let g = b.int_arg(1)?;
    if dims.len() < 2 || g < 1 || dims[1] % g != 0 {
        return Err(b.arg_error(1, "groups dividing the channel count", g));
    }
    let mut split = vec![dims[0], g, dims[1] / g];
    split.extend(&dims[2..]);
    let y = b.reshape(x, &split)?;
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend(3..split.len() as i64);
    let y = b.transpose(y, &perm);
    let out = b.reshape(y, &dims)?;
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = vec![
        op!("aten::flip", flip()),
        op!("aten::roll", roll()),
        op!("aten::channel_shuffle", channel_shuffle()),
    ];
    ops.extend(with_out!("aten::cat", cat()));
    ops.extend(forms!("aten::tril", triangle(true)));
    ops.extend(forms!("aten::triu", triangle(false)));
    ops
}
