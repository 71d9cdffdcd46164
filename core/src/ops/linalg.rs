//! Linear algebra: matrix, vector and batched products, trace, the cross
//! product, and vector norms.

use super::{
    accumulate_dtype, all_dims, binary_operands, broadcast_scalar, ensure, finish, is_float,
    keep_dims, reduce_dims, reduce_extreme, require_float, wrap_dim, wrap_dims, Arith, Form, OpDef,
};
use crate::builder::{Arg, Builder};
use crate::dtype::{Category, DType};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

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
    same_dtype(b, l.dtype, r.dtype)?;
    Ok((b.tensor(lhs)?, b.tensor(rhs)?))
}

fn same_dtype(b: &Builder, lhs: DType, rhs: DType) -> Result<()> {
    let got = format!("{lhs} and {rhs}");
    ensure(b, lhs == rhs, "operands", "the same dtype", got)
}

/// A matrix product accumulated in float32 for 16-bit inputs (as ATen
/// does), rounded to the input dtype.
fn matmul(
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
    let out = matmul(b, x, y, (&[], &[]), (&[1], &[0]))?;
    b.output(out)
}

fn bmm(b: &mut Builder) -> Result<()> {
    let (x, y) = matrices(b, 0, 1, 3)?;
    let out = matmul(b, x, y, (&[0], &[0]), (&[2], &[1]))?;
    b.output(out)
}

/// beta * self + alpha * (mat1 @ mat2); with beta == 0, self is ignored
/// (NaNs in it do not propagate), as in ATen.
fn addmm(b: &mut Builder, form: Form) -> Result<()> {
    let (x, y) = matrices(b, 1, 2, 2)?;
    let dtype = b.dtype(x);
    let mut out = matmul(b, x, y, (&[], &[]), (&[1], &[0]))?;
    let dims = b.dims(out);
    if b.num_args() > 4 && !matches!(b.arg(4)?, Arg::Int(1)) {
        let alpha = broadcast_scalar(b, 4, dtype, &dims)?;
        out = b.binary(BinaryOp::Mul, out, alpha)?;
    }
    let beta_zero = b.num_args() > 3 && matches!(b.arg(3)?, Arg::Int(0) | Arg::Float(0.0));
    if !beta_zero {
        let s = b.tensor(0)?;
        let s = b.convert(s, dtype);
        let mut s = b.broadcast_to(s, &dims)?;
        if b.num_args() > 3 && !matches!(b.arg(3)?, Arg::Int(1)) {
            let beta = broadcast_scalar(b, 3, dtype, &dims)?;
            s = b.binary(BinaryOp::Mul, s, beta)?;
        }
        out = b.binary(BinaryOp::Add, s, out)?;
    }
    finish(b, form, out)
}

/// The products beside mm/bmm/addmm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Product {
    /// dot: two vectors.
    Dot,
    /// vdot: two vectors, the first conjugated.
    Vdot,
    /// Matrix-vector, added to self.
    Addmv,
    /// Batched matrices, summed over the batch and added to self.
    Addbmm,
    /// Batched matrices, added to self per batch.
    Baddbmm,
}

/// Matrix-vector and batched products: dot/vdot (real), addmv, addbmm,
/// baddbmm, with beta/alpha as device inputs.
fn product(b: &mut Builder, kind: Product, form: Form) -> Result<()> {
    let (lhs, rhs) = match kind {
        Product::Dot | Product::Vdot => (0, 1),
        _ => (1, 2),
    };
    let (lv, rv) = (
        b.tensor_arg(lhs)?.view.clone(),
        b.tensor_arg(rhs)?.view.clone(),
    );
    same_dtype(b, lv.dtype, rv.dtype)?;
    let ranks = match kind {
        Product::Dot | Product::Vdot => (1, 1),
        Product::Addmv => (2, 1),
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
    let x = if kind == Product::Vdot { b.conj(x)? } else { x };
    let y = b.tensor(rhs)?;
    let mut p = match kind {
        Product::Dot | Product::Vdot => b.dot(x, y, (&[], &[]), (&[0], &[0]), acc)?,
        Product::Addmv => b.dot(x, y, (&[], &[]), (&[1], &[0]), acc)?,
        Product::Addbmm => b.dot(x, y, (&[], &[]), (&[0, 2], &[0, 1]), acc)?,
        Product::Baddbmm => b.dot(x, y, (&[0], &[0]), (&[2], &[1]), acc)?,
    };
    if matches!(kind, Product::Dot | Product::Vdot) {
        let p = b.convert(p, dtype);
        return b.output(p);
    }
    let dims = b.dims(p);
    if !matches!(b.arg(4), Ok(Arg::Int(1)) | Err(_)) {
        let alpha = broadcast_scalar(b, 4, acc, &dims)?;
        p = b.mul(p, alpha)?;
    }
    if !matches!(b.arg(3), Ok(Arg::Int(0)) | Ok(Arg::Float(0.0))) {
        let s = b.tensor(0)?;
        let s = b.convert(s, acc);
        let mut s = b.broadcast_to(s, &dims)?;
        if !matches!(b.arg(3), Ok(Arg::Int(1)) | Err(_)) {
            let beta = broadcast_scalar(b, 3, acc, &dims)?;
            s = b.mul(s, beta)?;
        }
        p = b.add(s, p)?;
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
    let dtype = if is_float(view.dtype) || view.dtype.category() == Category::Complex {
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

/// linalg_cross(self, other, *, dim): the cross product along a dim of size 3.
fn cross(b: &mut Builder) -> Result<()> {
    let (x, y, dtype) = binary_operands(b, false)?;
    let dims = b.dims(x);
    // wrap_dim accepts dim 0 of 0-d operands, which have no dim of size 3.
    ensure(
        b,
        !dims.is_empty(),
        "operands",
        "tensors of at least 1 dimension",
        "0-d tensors",
    )?;
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
        let p = b.mul(a, bb)?;
        let q = b.mul(cc, dd)?;
        comps.push(b.sub(p, q)?);
    }
    let out = b.concat(&comps, d)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// linalg_vector_norm(self, ord, dim?, keepdim, *, dtype?).
fn vector_norm(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = b.opt_dtype_arg(4)?.unwrap_or(view.dtype);
    require_float(b, "input", dtype)?;
    let ord = b.float_arg(1)?;
    let dims = reduce_dims(b, 2, view.sizes.len())?;
    let keepdim = b.bool_arg(3)?;
    p_norm(b, ord, &dims, keepdim, dtype)
}

/// norm.ScalarOpt_dim(self, p?, dim, keepdim) and friends: the vector
/// p-norm over dims (all when empty), with an optional dtype.
fn norm(b: &mut Builder, dim_index: Option<usize>, dtype_index: Option<usize>) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let dtype = match dtype_index
        .map(|i| b.opt_dtype_arg(i))
        .transpose()?
        .flatten()
    {
        Some(d) => d,
        None => view.dtype,
    };
    require_float(b, "input", dtype)?;
    let p = match b.arg(1) {
        Ok(Arg::None) | Err(_) => 2.0,
        Ok(_) => b.float_arg(1)?,
    };
    let rank = view.sizes.len();
    let dims: Vec<i64> = match dim_index
        .map(|i| b.opt_int_list_arg(i))
        .transpose()?
        .flatten()
    {
        Some(d) if !d.is_empty() && rank > 0 => wrap_dims(b, &d, rank)?,
        _ => all_dims(rank),
    };
    let keepdim = dim_index
        .map(|i| b.bool_arg(i + 1))
        .transpose()?
        .unwrap_or(false);
    p_norm(b, p, &dims, keepdim, dtype)
}

/// Outputs the vector p-norm of argument 0 over `dims` as `dtype`,
/// accumulated in float32 or wider.
fn p_norm(b: &mut Builder, p: f64, dims: &[i64], keepdim: bool, dtype: DType) -> Result<()> {
    let sizes = b.tensor_arg(0)?.view.sizes.clone();
    let x = b.tensor(0)?;
    let x = b.convert(x, accumulate_dtype(dtype));
    let a = b.unary(UnaryOp::Abs, x);
    let norm = if p.is_infinite() {
        let op = if p > 0.0 {
            ReduceOp::Max
        } else {
            ReduceOp::Min
        };
        reduce_extreme(b, a, op, dims)?
    } else if p == 0.0 {
        let zero = b.float_like(0.0, a);
        let nonzero = b.compare(CompareDir::Ne, a, zero)?;
        let dtype = b.dtype(a);
        let nonzero = b.convert(nonzero, dtype);
        b.reduce(nonzero, ReduceOp::Sum, dims)
    } else if p == 1.0 {
        b.reduce(a, ReduceOp::Sum, dims)
    } else if p == 2.0 {
        let sq = b.binary(BinaryOp::Mul, a, a)?;
        let s = b.reduce(sq, ReduceOp::Sum, dims);
        b.unary(UnaryOp::Sqrt, s)
    } else {
        let pv = b.float_like(p, a);
        let powered = b.binary(BinaryOp::Pow, a, pv)?;
        let s = b.reduce(powered, ReduceOp::Sum, dims);
        let inv = b.float_like(1.0 / p, s);
        b.binary(BinaryOp::Pow, s, inv)?
    };
    let norm = keep_dims(b, norm, &sizes, dims, keepdim)?;
    let out = b.convert(norm, dtype);
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::Functional as F;
    let mut ops = vec![
        op!("aten::addmm", addmm(F)),
        op!("aten::addmm.out", addmm(F)),
        op!("aten::addmm_", addmm(Form::InPlace)),
        op!("aten::vdot", product(Product::Vdot, F)),
        op!("aten::vdot.out", product(Product::Vdot, F)),
        op!("aten::trace", trace()),
        op!("aten::norm.ScalarOpt_dim", norm(Some(2), None)),
        op!("aten::norm.ScalarOpt_dim_dtype", norm(Some(2), Some(4))),
        op!("aten::norm.out", norm(Some(2), None)),
        op!("aten::norm.dtype_out", norm(Some(2), Some(4))),
        op!("aten::norm.Scalar", norm(None, None)),
        op!("aten::norm.ScalarOpt_dtype", norm(None, Some(2))),
    ];
    ops.extend(with_out!("aten::mm", mm()));
    ops.extend(with_out!("aten::bmm", bmm()));
    ops.extend(with_out!("aten::dot", product(Product::Dot, F)));
    ops.extend(forms!("aten::addmv", product(Product::Addmv)));
    ops.extend(forms!("aten::addbmm", product(Product::Addbmm)));
    ops.extend(forms!("aten::baddbmm", product(Product::Baddbmm)));
    ops.extend(with_out!("aten::linalg_cross", cross()));
    ops.extend(with_out!("aten::linalg_vector_norm", vector_norm()));
    ops
}
