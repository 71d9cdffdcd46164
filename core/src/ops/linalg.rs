//! Matrix products: mm, addmm, bmm.

use super::reduce::accumulate_dtype;
use super::{finish, op, Form, OpDef};
use crate::builder::Builder;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, ValueId};

/// Checks rank and dtype agreement of two matrix operands.
fn matrices(b: &mut Builder, lhs: usize, rhs: usize, rank: usize) -> Result<(ValueId, ValueId)> {
    let (l, r) = (
        b.tensor_arg(lhs)?.view.clone(),
        b.tensor_arg(rhs)?.view.clone(),
    );
    if l.sizes.len() != rank || r.sizes.len() != rank {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            format!("{rank}-D tensors"),
            format!("{}-D and {}-D", l.sizes.len(), r.sizes.len()),
        ));
    }
    if l.dtype != r.dtype {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "the same dtype",
            format!("{} and {}", l.dtype, r.dtype),
        ));
    }
    Ok((b.tensor(lhs)?, b.tensor(rhs)?))
}

/// A matrix product accumulated in float32 for 16-bit inputs (as ATen
/// does), rounded to the input dtype.
fn product(
    b: &mut Builder,
    x: ValueId,
    y: ValueId,
    batch: (&[i64], &[i64]),
    contract: (&[i64], &[i64]),
) -> Result<ValueId> {
    let dtype = b.dtype(x);
    let out = b.dot(x, y, batch, contract, accumulate_dtype(dtype))?;
    Ok(b.convert(out, dtype))
}

fn mm(b: &mut Builder) -> Result<()> {
    let (x, y) = matrices(b, 0, 1, 2)?;
    let out = product(b, x, y, (&[], &[]), (&[1], &[0]))?;
    b.output(out)
}

fn bmm(b: &mut Builder) -> Result<()> {
    let (x, y) = matrices(b, 0, 1, 3)?;
    let out = product(b, x, y, (&[0], &[0]), (&[2], &[1]))?;
    b.output(out)
}

/// beta * self + alpha * (mat1 @ mat2); with beta == 0, self is ignored
/// (NaNs in it do not propagate), as in ATen.
fn addmm(b: &mut Builder, form: Form) -> Result<()> {
    let (x, y) = matrices(b, 1, 2, 2)?;
    let dtype = b.dtype(x);
    let mut out = product(b, x, y, (&[], &[]), (&[1], &[0]))?;
    let dims = b.dims(out);
    if b.num_args() > 4 && !matches!(b.arg(4)?, crate::builder::Arg::Int(1)) {
        let alpha = b.scalar_arg(4, dtype)?;
        let alpha = b.broadcast_to(alpha, &dims)?;
        out = b.binary(BinaryOp::Mul, out, alpha)?;
    }
    let beta_zero = b.num_args() > 3
        && matches!(
            b.arg(3)?,
            crate::builder::Arg::Int(0) | crate::builder::Arg::Float(0.0)
        );
    if !beta_zero {
        let s = b.tensor(0)?;
        let s = b.convert(s, dtype);
        let mut s = b.broadcast_to(s, &dims)?;
        if b.num_args() > 3 && !matches!(b.arg(3)?, crate::builder::Arg::Int(1)) {
            let beta = b.scalar_arg(3, dtype)?;
            let beta = b.broadcast_to(beta, &dims)?;
            s = b.binary(BinaryOp::Mul, s, beta)?;
        }
        out = b.binary(BinaryOp::Add, s, out)?;
    }
    finish(b, form, out)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op("aten::mm", mm),
        op("aten::mm.out", mm),
        op("aten::bmm", bmm),
        op("aten::bmm.out", bmm),
        op("aten::addmm", |b| addmm(b, Form::Functional)),
        op("aten::addmm.out", |b| addmm(b, Form::Functional)),
        op("aten::addmm_", |b| addmm(b, Form::InPlace)),
    ]
}
