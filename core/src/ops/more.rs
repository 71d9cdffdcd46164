//! More of the OpInfo long tail: rsub, log-sigmoid, norms, small losses,
//! glu and prelu, logspace, channel_shuffle, isin, bucketize/searchsorted,
//! random fills from other distributions, and order statistics.

use super::reduce::accumulate_dtype;
use super::{broadcast_all, is_float, op, operand, result_type, wrap_dim, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

fn k(b: &mut Builder, v: f64, like: ValueId) -> ValueId {
    let (dtype, dims) = (b.dtype(like), b.dims(like));
    b.constant(Literal::Float(v), dtype, &dims)
}

/// rsub(self, other, alpha) = other - alpha * self.
fn rsub(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let y = operand(b, 1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    let x = if matches!(b.arg(2), Ok(Arg::Int(1)) | Err(_)) {
        x
    } else {
        let a = b.scalar_arg(2, dtype)?;
        let a = b.broadcast_to(a, &b.dims(x))?;
        b.binary(BinaryOp::Mul, x, a)?
    };
    let out = b.binary(BinaryOp::Sub, y, x)?;
    b.output(out)
}

/// log_sigmoid_forward(self) -> (out, buffer) = -softplus(-x); the buffer
/// ATen's CPU kernel keeps is not needed here and is returned empty.
fn log_sigmoid(b: &mut Builder) -> Result<()> {
    let x = b.tensor(0)?;
    let dtype = b.dtype(x);
    let acc = accumulate_dtype(dtype);
    let x = b.convert(x, acc);
    // -softplus(-x) = min(x, 0) - log1p(exp(-|x|)), stable for large |x|.
    let zero = k(b, 0.0, x);
    let m = b.binary(BinaryOp::Min, x, zero)?;
    let a = b.unary(UnaryOp::Abs, x);
    let na = b.unary(UnaryOp::Neg, a);
    let e = b.unary(UnaryOp::Exp, na);
    let l = b.unary(UnaryOp::Log1p, e);
    let out = b.binary(BinaryOp::Sub, m, l)?;
    let out = b.convert(out, dtype);
    b.output(out)?;
    let empty = b.constant(Literal::Int(0), dtype, &[0]);
    b.output(empty)
}

/// log_sigmoid_backward(grad, self, buffer) = grad * sigmoid(-x).
fn log_sigmoid_backward(b: &mut Builder) -> Result<()> {
    let x = b.tensor(1)?;
    let dtype = b.dtype(x);
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let nx = b.unary(UnaryOp::Neg, x);
    let s = b.unary(UnaryOp::Logistic, nx);
    let out = b.binary(BinaryOp::Mul, g, s)?;
    b.output(out)
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
    if !is_float(dtype) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a floating point tensor",
            dtype,
        ));
    }
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
        Some(d) if !d.is_empty() && rank > 0 => d
            .iter()
            .map(|&x| wrap_dim(b, x, rank).map(|v| v as i64))
            .collect::<Result<_>>()?,
        _ => (0..rank as i64).collect(),
    };
    let keepdim = dim_index
        .map(|i| b.bool_arg(i + 1))
        .transpose()?
        .unwrap_or(false);
    let acc = accumulate_dtype(dtype);
    let x = b.tensor(0)?;
    let x = b.convert(x, acc);
    let a = b.unary(UnaryOp::Abs, x);
    let out = if p == f64::INFINITY {
        b.reduce(a, ReduceOp::Max, &dims)
    } else if p == f64::NEG_INFINITY {
        b.reduce(a, ReduceOp::Min, &dims)
    } else if p == 0.0 {
        let zero = k(b, 0.0, a);
        let nz = b.compare(CompareDir::Ne, a, zero)?;
        let nz = b.convert(nz, acc);
        b.reduce(nz, ReduceOp::Sum, &dims)
    } else if p == 1.0 {
        b.reduce(a, ReduceOp::Sum, &dims)
    } else if p == 2.0 {
        let sq = b.binary(BinaryOp::Mul, a, a)?;
        let s = b.reduce(sq, ReduceOp::Sum, &dims);
        b.unary(UnaryOp::Sqrt, s)
    } else {
        let pv = k(b, p, a);
        let powered = b.binary(BinaryOp::Pow, a, pv)?;
        let s = b.reduce(powered, ReduceOp::Sum, &dims);
        let inv = k(b, 1.0 / p, s);
        b.binary(BinaryOp::Pow, s, inv)?
    };
    let out = if keepdim {
        let shape: Vec<i64> = view
            .sizes
            .iter()
            .enumerate()
            .map(|(d, &v)| if dims.contains(&(d as i64)) { 1 } else { v })
            .collect();
        b.reshape(out, &shape)?
    } else {
        out
    };
    let out = b.convert(out, dtype);
    b.output(out)
}

/// Reduces elementwise losses per `reduction` (0 none, 1 mean, 2 sum).
fn reduce_loss(b: &mut Builder, losses: ValueId, reduction: i64) -> Result<ValueId> {
    let dims: Vec<i64> = (0..b.dims(losses).len() as i64).collect();
    let n = b.ty(losses).numel();
    match reduction {
        0 => Ok(losses),
        1 => {
            let s = b.reduce(losses, ReduceOp::Sum, &dims);
            let count = b.constant(Literal::Int(n), b.dtype(s), &[]);
            b.binary(BinaryOp::Div, s, count)
        }
        2 => Ok(b.reduce(losses, ReduceOp::Sum, &dims)),
        r => Err(Error::invalid(
            format!("{}: reduction", b.op_name()),
            "0 (none), 1 (mean) or 2 (sum)",
            r,
        )),
    }
}

/// The gradient factor of a reduced loss: grad (broadcast), / n for mean.
fn loss_grad_scale(
    b: &mut Builder,
    grad: usize,
    dims: &[i64],
    reduction: i64,
    dtype: DType,
) -> Result<ValueId> {
    let g = b.tensor(grad)?;
    let g = b.convert(g, dtype);
    let g = b.broadcast_to(g, dims)?;
    if reduction == 1 {
        let n: i64 = dims.iter().product();
        let nv = b.constant(Literal::Int(n), dtype, dims);
        b.binary(BinaryOp::Div, g, nv)
    } else {
        Ok(g)
    }
}

/// smooth_l1 (beta) and huber (delta) losses, forward (self, target,
/// reduction, param) and backward (grad, self, target, reduction, param).
fn smooth_loss(b: &mut Builder, huber: bool, backward: bool) -> Result<()> {
    let first = if backward { 1 } else { 0 };
    let dtype = result_type(b, &[first, first + 1])?;
    let x = operand(b, first, dtype)?;
    let t = operand(b, first + 1, dtype)?;
    let [x, t] = broadcast_all(b, &[x, t])?[..] else {
        unreachable!("two values in, two out")
    };
    let reduction = b.int_arg(first + 2)?;
    let param = b.float_arg(first + 3)?;
    let d = b.binary(BinaryOp::Sub, x, t)?;
    let a = b.unary(UnaryOp::Abs, d);
    let pv = k(b, param, a);
    let small = b.compare(CompareDir::Lt, a, pv)?;
    if backward {
        let dims = b.dims(d);
        let g = loss_grad_scale(b, 0, &dims, reduction, dtype)?;
        // d/dx: d / beta (huber: d) inside, sign(d) (huber: delta sign(d)) outside.
        let inside = if huber || param == 0.0 {
            d
        } else {
            b.binary(BinaryOp::Div, d, pv)?
        };
        let sign = b.unary(UnaryOp::Sign, d);
        let outside = if huber {
            b.binary(BinaryOp::Mul, sign, pv)?
        } else {
            sign
        };
        let dl = b.select(small, inside, outside)?;
        let out = b.binary(BinaryOp::Mul, g, dl)?;
        return b.output(out);
    }
    let half = k(b, 0.5, d);
    let sq = b.binary(BinaryOp::Mul, d, d)?;
    let hsq = b.binary(BinaryOp::Mul, half, sq)?;
    let (inside, outside) = if huber {
        let hp = b.binary(BinaryOp::Mul, half, pv)?;
        let ahp = b.binary(BinaryOp::Sub, a, hp)?;
        (hsq, b.binary(BinaryOp::Mul, pv, ahp)?)
    } else {
        let inside = if param == 0.0 {
            hsq
        } else {
            b.binary(BinaryOp::Div, hsq, pv)?
        };
        let hp = b.binary(BinaryOp::Mul, half, pv)?;
        (inside, b.binary(BinaryOp::Sub, a, hp)?)
    };
    let losses = b.select(small, inside, outside)?;
    let out = reduce_loss(b, losses, reduction)?;
    b.output(out)
}

/// binary_cross_entropy(self, target, weight?, reduction) with log clamped
/// at -100, and its backward (grad, self, target, weight?, reduction).
fn bce(b: &mut Builder, backward: bool) -> Result<()> {
    let first = if backward { 1 } else { 0 };
    let x = b.tensor(first)?;
    let dtype = b.dtype(x);
    let dims = b.dims(x);
    let t = b.tensor(first + 1)?;
    let t = b.convert(t, dtype);
    let t = b.broadcast_to(t, &dims)?;
    let w = match b.opt_tensor_arg(first + 2)? {
        Some(_) => {
            let w = b.tensor(first + 2)?;
            let w = b.convert(w, dtype);
            Some(b.broadcast_to(w, &dims)?)
        }
        None => None,
    };
    let reduction = b.int_arg(first + 3)?;
    let one = k(b, 1.0, x);
    let omx = b.binary(BinaryOp::Sub, one, x)?;
    let out = if backward {
        // g w (x - t) / max(x (1 - x), 1e-12)
        let g = loss_grad_scale(b, 0, &dims, reduction, dtype)?;
        let num = b.binary(BinaryOp::Sub, x, t)?;
        let den = b.binary(BinaryOp::Mul, x, omx)?;
        let eps = k(b, 1e-12, den);
        let den = b.binary(BinaryOp::Max, den, eps)?;
        let q = b.binary(BinaryOp::Div, num, den)?;
        let q = b.binary(BinaryOp::Mul, g, q)?;
        match w {
            Some(w) => b.binary(BinaryOp::Mul, q, w)?,
            None => q,
        }
    } else {
        let floor = k(b, -100.0, x);
        let lx = b.unary(UnaryOp::Log, x);
        let lx = b.binary(BinaryOp::Max, lx, floor)?;
        let l1x = b.unary(UnaryOp::Log, omx);
        let l1x = b.binary(BinaryOp::Max, l1x, floor)?;
        let omt = b.binary(BinaryOp::Sub, one, t)?;
        let p = b.binary(BinaryOp::Mul, t, lx)?;
        let q = b.binary(BinaryOp::Mul, omt, l1x)?;
        let s = b.binary(BinaryOp::Add, p, q)?;
        let l = b.unary(UnaryOp::Neg, s);
        let l = match w {
            Some(w) => b.binary(BinaryOp::Mul, l, w)?,
            None => l,
        };
        reduce_loss(b, l, reduction)?
    };
    b.output(out)
}

/// glu(self, dim) = a * sigmoid(b) of the two halves; backward(grad, self, dim).
fn glu(b: &mut Builder, backward: bool) -> Result<()> {
    let xi = if backward { 1 } else { 0 };
    let x = b.tensor(xi)?;
    let dims = b.dims(x);
    let d = wrap_dim(b, b.int_arg(xi + 1)?, dims.len())?;
    if dims[d] % 2 != 0 {
        return Err(b.arg_error(xi + 1, "a dimension of even size", dims[d]));
    }
    let half = dims[d] / 2;
    let mut lo_limit = dims.clone();
    lo_limit[d] = half;
    let mut hi_start = vec![0; dims.len()];
    hi_start[d] = half;
    let ones = vec![1; dims.len()];
    let a = b.slice(x, &vec![0; dims.len()], &lo_limit, &ones);
    let c = b.slice(x, &hi_start, &dims, &ones);
    let s = b.unary(UnaryOp::Logistic, c);
    if !backward {
        let out = b.binary(BinaryOp::Mul, a, s)?;
        return b.output(out);
    }
    let g = b.tensor(0)?;
    let g = b.convert(g, b.dtype(x));
    let ga = b.binary(BinaryOp::Mul, g, s)?;
    let one = k(b, 1.0, s);
    let oms = b.binary(BinaryOp::Sub, one, s)?;
    let ds = b.binary(BinaryOp::Mul, s, oms)?;
    let gb = b.binary(BinaryOp::Mul, g, a)?;
    let gb = b.binary(BinaryOp::Mul, gb, ds)?;
    let out = b.concat(&[ga, gb], d)?;
    b.output(out)
}

/// _prelu_kernel(self, weight) = x > 0 ? x : w x (weight broadcast).
fn prelu(b: &mut Builder) -> Result<()> {
    let x = b.tensor(0)?;
    let w = b.tensor(1)?;
    let [x, w] = broadcast_all(b, &[x, w])?[..] else {
        unreachable!("two values in, two out")
    };
    let zero = k(b, 0.0, x);
    let pos = b.compare(CompareDir::Gt, x, zero)?;
    let wx = b.binary(BinaryOp::Mul, w, x)?;
    let out = b.select(pos, x, wx)?;
    b.output(out)
}

/// _prelu_kernel_backward(grad, self, weight) -> (grad_input, grad_weight).
fn prelu_backward(b: &mut Builder) -> Result<()> {
    let weight_sizes = b.tensor_arg(2)?.view.sizes.clone();
    let g = b.tensor(0)?;
    let x = b.tensor(1)?;
    let w = b.tensor(2)?;
    let [g, x, w] = broadcast_all(b, &[g, x, w])?[..] else {
        unreachable!("three values in, three out")
    };
    let zero = k(b, 0.0, x);
    let pos = b.compare(CompareDir::Gt, x, zero)?;
    let wg = b.binary(BinaryOp::Mul, w, g)?;
    let gi = b.select(pos, g, wg)?;
    b.output(gi)?;
    let xg = b.binary(BinaryOp::Mul, x, g)?;
    let gw = b.select(pos, zero, xg)?;
    // Sum over the dims the weight was broadcast along.
    let dims = b.dims(gw);
    let lead = dims.len() - weight_sizes.len();
    let reduce: Vec<i64> = (0..dims.len())
        .filter(|&d| d < lead || weight_sizes[d - lead] == 1 && dims[d] != 1)
        .map(|d| d as i64)
        .collect();
    let gw = b.reduce(gw, ReduceOp::Sum, &reduce);
    let gw = b.reshape(gw, &weight_sizes)?;
    b.output(gw)
}

/// logspace.out(start, end, steps, base, *, out): base ** linspace.
fn logspace(b: &mut Builder) -> Result<()> {
    let steps = b.int_arg(2)?;
    if steps < 0 {
        return Err(b.arg_error(2, "steps >= 0", steps));
    }
    let dtype = b.tensor_arg(4)?.view.dtype;
    let work = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let (start, end, base) = (b.float_arg(0)?, b.float_arg(1)?, b.float_arg(3)?);
    let n = [steps];
    let step = if steps > 1 {
        (end - start) / (steps - 1) as f64
    } else {
        0.0
    };
    let i = b.iota(work, &n, 0);
    let s = b.scalar_input(Literal::Float(start), work);
    let s = b.broadcast_to(s, &n)?;
    let st = b.scalar_input(Literal::Float(step), work);
    let st = b.broadcast_to(st, &n)?;
    let e = b.binary(BinaryOp::Mul, i, st)?;
    let e = b.binary(BinaryOp::Add, s, e)?;
    let bv = b.scalar_input(Literal::Float(base), work);
    let bv = b.broadcast_to(bv, &n)?;
    let out = b.binary(BinaryOp::Pow, bv, e)?;
    let out = b.convert(out, dtype);
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

/// isin.Tensor_Tensor(elements, test_elements, *, assume_unique, invert).
fn isin(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let x = operand(b, 0, dtype)?;
    let t = operand(b, 1, dtype)?;
    let dims = b.dims(x);
    let n = b.ty(t).numel();
    let t = b.reshape(t, &[n])?;
    let mut full = dims.clone();
    full.push(n);
    let xb = b.broadcast_in_dim(x, &full, &(0..dims.len() as i64).collect::<Vec<_>>());
    let tb = b.broadcast_in_dim(t, &full, &[dims.len() as i64]);
    let eq = b.compare(CompareDir::Eq, xb, tb)?;
    let any = b.reduce(eq, ReduceOp::Or, &[dims.len() as i64]);
    let out = if b.bool_arg(3)? {
        b.unary(UnaryOp::Not, any)
    } else {
        any
    };
    b.output(out)
}

/// bucketize.Tensor(self, boundaries, *, out_int32, right) and
/// searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side,
/// sorter?): how many boundaries lie below each value (left) or at or below
/// it (right), per row of an N-D sequence.
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
    if searchsorted && b.opt_tensor_arg(5)?.is_some() {
        // The sequence in sorted order: gather along its last dim.
        let sdims = b.dims(s);
        let m = *sdims.last().unwrap_or(&1);
        let rows: i64 = sdims[..sdims.len().saturating_sub(1)].iter().product();
        let sorter = b.tensor(5)?;
        let sorter = b.convert(sorter, DType::I64);
        let sorter = b.reshape(sorter, &[rows, m])?;
        let row = b.iota(DType::I64, &[rows, m], 0);
        let mv = b.constant(Literal::Int(m), DType::I64, &[rows, m]);
        let base = b.binary(BinaryOp::Mul, row, mv)?;
        let flat = b.binary(BinaryOp::Add, base, sorter)?;
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
    let below = b.compare(
        if right {
            CompareDir::Le
        } else {
            CompareDir::Lt
        },
        sb,
        vb,
    )?;
    let count = b.convert(below, DType::I64);
    let out = b.reduce(count, ReduceOp::Sum, &[vdims.len() as i64]);
    let out = if out_int32 {
        b.convert(out, DType::I32)
    } else {
        out
    };
    b.output(out)
}

/// Random fills from uniform draws: exponential_(lambd), geometric_(p),
/// log_normal_(mean, std), cauchy_(median, sigma); the generator follows
/// the two parameters (one for the one-parameter forms).
fn random_fill(b: &mut Builder, kind: &str) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    if !is_float(view.dtype) {
        return Err(b.arg_error(0, "a floating point tensor", view.dtype));
    }
    let two_params = matches!(kind, "log_normal" | "cauchy");
    let generator = if two_params { 3 } else { 2 };
    let work = if view.dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let dims = view.sizes.clone();
    let u = super::misc::uniform01(b, generator, work, &dims)?;
    let one = b.constant(Literal::Float(1.0), work, &dims);
    let p1 = b.scalar_arg(1, work)?;
    let p1 = b.broadcast_to(p1, &dims)?;
    let out = match kind {
        "exponential" => {
            // -log(1 - u) / lambda, with 1 - u in (0, 1].
            let omu = b.binary(BinaryOp::Sub, one, u)?;
            let l = b.unary(UnaryOp::Log, omu);
            let l = b.unary(UnaryOp::Neg, l);
            b.binary(BinaryOp::Div, l, p1)?
        }
        "geometric" => {
            // ceil(log(1 - u) / log(1 - p)), at least 1.
            let omu = b.binary(BinaryOp::Sub, one, u)?;
            let lu = b.unary(UnaryOp::Log, omu);
            let omp = b.binary(BinaryOp::Sub, one, p1)?;
            let lp = b.unary(UnaryOp::Log, omp);
            let q = b.binary(BinaryOp::Div, lu, lp)?;
            let c = b.unary(UnaryOp::Ceil, q);
            b.binary(BinaryOp::Max, c, one)?
        }
        "log_normal" => {
            let u2 = super::misc::uniform01_second(b, generator, work, &dims)?;
            let z = super::misc::box_muller(b, u, u2)?;
            let p2 = b.scalar_arg(2, work)?;
            let p2 = b.broadcast_to(p2, &dims)?;
            let sz = b.binary(BinaryOp::Mul, z, p2)?;
            let e = b.binary(BinaryOp::Add, sz, p1)?;
            b.unary(UnaryOp::Exp, e)
        }
        _ => {
            // median + sigma tan(pi (u - 1/2))
            let half = b.constant(Literal::Float(0.5), work, &dims);
            let c = b.binary(BinaryOp::Sub, u, half)?;
            let pi = b.constant(Literal::Float(std::f64::consts::PI), work, &dims);
            let a = b.binary(BinaryOp::Mul, pi, c)?;
            let t = b.unary(UnaryOp::Tan, a);
            let p2 = b.scalar_arg(2, work)?;
            let p2 = b.broadcast_to(p2, &dims)?;
            let st = b.binary(BinaryOp::Mul, p2, t)?;
            b.binary(BinaryOp::Add, p1, st)?
        }
    };
    b.write_arg(0, out)
}

/// kthvalue(self, k, dim, keepdim) and median.dim(self, dim, keepdim):
/// (value, index) from a stable sort; median is the lower middle.
fn order_statistic(b: &mut Builder, median: bool) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let work = if view.sizes.is_empty() {
        vec![1]
    } else {
        view.sizes.clone()
    };
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
    let x = b.tensor(0)?;
    let x = b.reshape(x, &work)?;
    let iota = b.iota(DType::I64, &work, d);
    let (values, indices) = b.sort(x, iota, d, false);
    let mut start = vec![0; work.len()];
    start[d] = kth;
    let mut limit = work.clone();
    limit[d] = kth + 1;
    let ones = vec![1; work.len()];
    let v = b.slice(values, &start, &limit, &ones);
    let i = b.slice(indices, &start, &limit, &ones);
    let shape = super::reduce::reduced_shape(&view.sizes, d, keepdim);
    let v = b.reshape(v, &shape)?;
    let i = b.reshape(i, &shape)?;
    b.output(v)?;
    b.output(i)
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
        let work = if view.sizes.is_empty() {
            vec![1]
        } else {
            view.sizes.clone()
        };
        let d = wrap_dim(b, b.int_arg(1)?, view.sizes.len())?;
        (work, d, b.bool_arg(2)?)
    } else {
        (vec![view.numel() as i64], 0, false)
    };
    let n = work[d];
    if n == 0 {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a non-empty dimension",
            format!("{:?}", view.sizes),
        ));
    }
    let x = b.tensor(0)?;
    let x = b.reshape(x, &work)?;
    let iota = b.iota(DType::I64, &work, d);
    let (values, indices) = b.sort(x, iota, d, false);
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
    let shape = super::reduce::reduced_shape(&view.sizes, d, keepdim);
    let value = b.reshape(value, &shape)?;
    let index = b.select(no_values, zero, index)?;
    let index = b.reshape(index, &shape)?;
    b.output(value)?;
    b.output(index)
}

pub(super) fn ops() -> Vec<OpDef> {
    vec![
        op("aten::rsub.Tensor", rsub),
        op("aten::rsub.Scalar", rsub),
        op("aten::log_sigmoid_forward", log_sigmoid),
        op("aten::log_sigmoid_backward", log_sigmoid_backward),
        op(
            "aten::log_sigmoid_backward.grad_input",
            log_sigmoid_backward,
        ),
        op("aten::norm.ScalarOpt_dim", |b| norm(b, Some(2), None)),
        op("aten::norm.ScalarOpt_dim_dtype", |b| {
            norm(b, Some(2), Some(4))
        }),
        op("aten::norm.out", |b| norm(b, Some(2), None)),
        op("aten::norm.dtype_out", |b| norm(b, Some(2), Some(4))),
        op("aten::norm.Scalar", |b| norm(b, None, None)),
        op("aten::norm.ScalarOpt_dtype", |b| norm(b, None, Some(2))),
        op("aten::smooth_l1_loss", |b| smooth_loss(b, false, false)),
        op("aten::smooth_l1_loss.out", |b| smooth_loss(b, false, false)),
        op("aten::smooth_l1_loss_backward", |b| {
            smooth_loss(b, false, true)
        }),
        op("aten::smooth_l1_loss_backward.grad_input", |b| {
            smooth_loss(b, false, true)
        }),
        op("aten::huber_loss", |b| smooth_loss(b, true, false)),
        op("aten::huber_loss.out", |b| smooth_loss(b, true, false)),
        op("aten::huber_loss_backward", |b| smooth_loss(b, true, true)),
        op("aten::huber_loss_backward.out", |b| {
            smooth_loss(b, true, true)
        }),
        op("aten::binary_cross_entropy", |b| bce(b, false)),
        op("aten::binary_cross_entropy.out", |b| bce(b, false)),
        op("aten::binary_cross_entropy_backward", |b| bce(b, true)),
        op("aten::binary_cross_entropy_backward.grad_input", |b| {
            bce(b, true)
        }),
        op("aten::glu", |b| glu(b, false)),
        op("aten::glu.out", |b| glu(b, false)),
        op("aten::glu_backward", |b| glu(b, true)),
        op("aten::glu_backward.grad_input", |b| glu(b, true)),
        op("aten::_prelu_kernel", prelu),
        op("aten::_prelu_kernel_backward", prelu_backward),
        op("aten::logspace.out", logspace),
        op("aten::channel_shuffle", channel_shuffle),
        op("aten::isin.Tensor_Tensor", isin),
        op("aten::isin.Tensor_Tensor_out", isin),
        op("aten::bucketize.Tensor", |b| bucket(b, false)),
        op("aten::bucketize.Tensor_out", |b| bucket(b, false)),
        op("aten::searchsorted.Tensor", |b| bucket(b, true)),
        op("aten::searchsorted.Tensor_out", |b| bucket(b, true)),
        op("aten::exponential_", |b| random_fill(b, "exponential")),
        op("aten::geometric_", |b| random_fill(b, "geometric")),
        op("aten::log_normal_", |b| random_fill(b, "log_normal")),
        op("aten::cauchy_", |b| random_fill(b, "cauchy")),
        op("aten::kthvalue", |b| order_statistic(b, false)),
        op("aten::kthvalue.values", |b| order_statistic(b, false)),
        op("aten::median.dim", |b| order_statistic(b, true)),
        op("aten::median.dim_values", |b| order_statistic(b, true)),
        op("aten::median", median_all),
        op("aten::nanmedian", |b| nanmedian(b, false)),
        op("aten::nanmedian.dim", |b| nanmedian(b, true)),
        op("aten::nanmedian.dim_values", |b| nanmedian(b, true)),
    ]
}
