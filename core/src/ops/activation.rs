//! Activations and their backwards: relu's backward, gelu (exact and
//! tanh), silu, softplus, elu, leaky_relu, hardtanh, hardswish, threshold,
//! soft/hard shrink, log-sigmoid, glu and prelu; mish's backward.

use super::unary::tanh_softplus;
use super::{
    accumulate_dtype, broadcast_all, broadcast_scalar, ensure, finish, float_input, operand_pair,
    result_type, wrap_dim, Arith, Form, OpDef, Pass,
};
use crate::builder::{Arg, Builder};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, UnaryOp, ValueId};

/// A builder for values of one shape and dtype: constants and scalar
/// arguments in that shape, and the builder's own ops through `Deref`.
struct Ew<'b, 'a> {
    b: &'b mut Builder<'a>,
    dims: Dims,
    dtype: DType,
}

impl Ew<'_, '_> {
    fn c(&mut self, v: f64) -> ValueId {
        self.b.constant(Literal::Float(v), self.dtype, &self.dims)
    }
    /// `x > 0`.
    fn positive(&mut self, x: ValueId) -> Result<ValueId> {
        let zero = self.c(0.0);
        self.b.compare(CompareDir::Gt, x, zero)
    }
    fn scalar(&mut self, index: usize) -> Result<ValueId> {
        let s = self.b.scalar_arg(index, self.dtype)?;
        self.b.broadcast_to(s, &self.dims)
    }
}

impl<'a> std::ops::Deref for Ew<'_, 'a> {
    type Target = Builder<'a>;
    fn deref(&self) -> &Builder<'a> {
        self.b
    }
}

impl<'a> std::ops::DerefMut for Ew<'_, 'a> {
    fn deref_mut(&mut self) -> &mut Builder<'a> {
        self.b
    }
}

// Activations compute 16-bit floats in float32, scalar arguments (a slope,
// a threshold) included, and round the result once, as ATen's CPU kernels
// do. Rounded at each step, or with the slope rounded first, a float16
// result lands ulps off, and a tiny one (a subnormal) can differ entirely.

/// The gradient at `grad_index` and the float input at `x_index`, both in
/// the dtype the activation computes in (float32 for 16-bit floats), with
/// the input's own dtype and sizes.
fn grad_and_input(
    b: &mut Builder,
    grad_index: usize,
    x_index: usize,
) -> Result<(ValueId, ValueId, DType, Dims)> {
    let (x, dtype, dims) = float_input(b, x_index)?;
    let wide = accumulate_dtype(dtype);
    let x = b.convert(x, wide);
    let g = b.tensor(grad_index)?;
    let g = b.convert(g, wide);
    Ok((g, x, dtype, dims))
}

/// Forward activation on argument 0; `f` computes it on (x).
fn forward(b: &mut Builder, f: fn(&mut Ew, ValueId) -> Result<ValueId>, form: Form) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let wide = accumulate_dtype(dtype);
    let x = b.convert(x, wide);
    let out = f(
        &mut Ew {
            b,
            dims,
            dtype: wide,
        },
        x,
    )?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// Backward `grad * f'(x)` with grad at `grad_index`, x at `x_index`.
fn backward(
    b: &mut Builder,
    grad_index: usize,
    x_index: usize,
    f: fn(&mut Ew, ValueId) -> Result<ValueId>,
) -> Result<()> {
    let (g, x, dtype, dims) = grad_and_input(b, grad_index, x_index)?;
    let g = b.broadcast_to(g, &dims)?;
    let wide = accumulate_dtype(dtype);
    let d = f(
        &mut Ew {
            b,
            dims,
            dtype: wide,
        },
        x,
    )?;
    let out = b.binary(BinaryOp::Mul, g, d)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

fn tanh_approximation(b: &Builder, index: usize) -> Result<bool> {
    match b.arg(index) {
        Err(_) | Ok(Arg::None) => Ok(false),
        Ok(Arg::Str(s)) if s == "none" => Ok(false),
        Ok(Arg::Str(s)) if s == "tanh" => Ok(true),
        Ok(other) => Err(b.arg_error(index, "approximate='none' or 'tanh'", other.kind())),
    }
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044715;

/// Φ(x) = (1 + erf(x / √2)) / 2, the normal CDF, as ATen computes it, but 0
/// where x / √2 < -4: there float32's 1 + erf is 0 in ATen, while XLA's erf
/// stops short of -1 (at -0.9999998), which made gelu(x) about -1e-7 x for
/// every large negative x (gelu(-20) = -2e-6). XLA's erfc has no such
/// floor but costs twice as much.
fn normal_cdf(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let r = e.c(std::f64::consts::FRAC_1_SQRT_2);
    let z = e.mul(x, r)?;
    let erf = e.unary(UnaryOp::Erf, z);
    let one = e.c(1.0);
    let half = e.c(0.5);
    let s = e.add(one, erf)?;
    let cdf = e.mul(half, s)?;
    let floor = e.c(-4.0);
    let below = e.compare(CompareDir::Lt, z, floor)?;
    let zero = e.c(0.0);
    e.select(below, zero, cdf)
}

/// 0.5 x (1 + t): tanh-gelu, with t its tanh term.
fn half_x_one_plus(e: &mut Ew, x: ValueId, t: ValueId) -> Result<ValueId> {
    let one = e.c(1.0);
    let half = e.c(0.5);
    let s = e.add(one, t)?;
    let hx = e.mul(half, x)?;
    e.mul(hx, s)
}

/// 0.5 (1 + t): tanh-gelu's gradient's first term.
fn half_one_plus(e: &mut Ew, t: ValueId) -> Result<ValueId> {
    let one = e.c(1.0);
    let half = e.c(0.5);
    let s = e.add(one, t)?;
    e.mul(half, s)
}

fn gelu_exact(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let cdf = normal_cdf(e, x)?;
    e.mul(x, cdf)
}

/// √(2/π) (a + c p): with a = x, p = x³ the tanh-gelu inner term, with
/// a = 1, p = x² and c tripled its derivative.
fn scaled_cubic(e: &mut Ew, a: ValueId, c: f64, p: ValueId) -> Result<ValueId> {
    let c = e.c(c);
    let k = e.c(SQRT_2_OVER_PI);
    let cp = e.mul(c, p)?;
    let s = e.add(a, cp)?;
    e.mul(k, s)
}

fn gelu_tanh_inner(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let x2 = e.mul(x, x)?;
    let x3 = e.mul(x2, x)?;
    scaled_cubic(e, x, GELU_CUBIC, x3)
}

fn gelu_tanh(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let inner = gelu_tanh_inner(e, x)?;
    let t = e.unary(UnaryOp::Tanh, inner);
    half_x_one_plus(e, x, t)
}

fn gelu_exact_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // Φ(x) + x φ(x)
    let cdf = normal_cdf(e, x)?;
    let pdf = normal_pdf(e, x)?;
    let xpdf = e.mul(x, pdf)?;
    e.add(cdf, xpdf)
}

/// φ(x) = exp(-x² / 2) / √(2π).
fn normal_pdf(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let x2 = e.mul(x, x)?;
    let mhalf = e.c(-0.5);
    let ex = e.mul(mhalf, x2)?;
    let ex = e.unary(UnaryOp::Exp, ex);
    let norm = e.c(1.0 / (2.0 * std::f64::consts::PI).sqrt());
    e.mul(norm, ex)
}

fn gelu_tanh_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // 0.5(1 + t) + 0.5 x (1 - t²) k (1 + 3c x²)
    let inner = gelu_tanh_inner(e, x)?;
    let t = e.unary(UnaryOp::Tanh, inner);
    let left = half_one_plus(e, t)?;
    let (one, half) = (e.c(1.0), e.c(0.5));
    let t2 = e.mul(t, t)?;
    let sech2 = e.sub(one, t2)?;
    let x2 = e.mul(x, x)?;
    let kp = scaled_cubic(e, one, 3.0 * GELU_CUBIC, x2)?;
    let hx = e.mul(half, x)?;
    let a = e.mul(hx, sech2)?;
    let right = e.mul(a, kp)?;
    e.add(left, right)
}

fn gelu(b: &mut Builder, form: Form) -> Result<()> {
    if tanh_approximation(b, 1)? {
        forward(b, gelu_tanh, form)
    } else {
        forward(b, gelu_exact, form)
    }
}

fn gelu_backward(b: &mut Builder) -> Result<()> {
    if tanh_approximation(b, 2)? {
        backward(b, 0, 1, gelu_tanh_grad)
    } else {
        backward(b, 0, 1, gelu_exact_grad)
    }
}

fn silu(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let s = e.unary(UnaryOp::Logistic, x);
    e.mul(x, s)
}

fn silu_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // s (1 + x (1 - s))
    let s = e.unary(UnaryOp::Logistic, x);
    let one = e.c(1.0);
    let oms = e.sub(one, s)?;
    let xo = e.mul(x, oms)?;
    let p = e.add(one, xo)?;
    e.mul(s, p)
}

/// mish_backward(grad, self): mish'(x) = t + x σ(x) (1 - t²) with t =
/// tanh(softplus(x)), as ATen's kernel computes it (autograd's decomposition
/// into separate ops rounded float16 results at each step).
fn mish_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let t = tanh_softplus(e.b, x)?;
    let s = e.unary(UnaryOp::Logistic, x);
    let one = e.c(1.0);
    let t2 = e.mul(t, t)?;
    let sech2 = e.sub(one, t2)?;
    let xs = e.mul(x, s)?;
    let right = e.mul(xs, sech2)?;
    e.add(t, right)
}

/// softplus(x) = log1p(exp(beta x)) / beta, or x where beta x > threshold.
fn softplus(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let beta = e.scalar(1)?;
    let threshold = e.scalar(2)?;
    let bx = e.mul(beta, x)?;
    let ex = e.unary(UnaryOp::Exp, bx);
    let l = e.unary(UnaryOp::Log1p, ex);
    let soft = e.div(l, beta)?;
    let linear = e.compare(CompareDir::Gt, bx, threshold)?;
    e.select(linear, x, soft)
}

/// softplus_backward(grad, self, beta, threshold).
fn softplus_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let beta = e.scalar(2)?;
    let threshold = e.scalar(3)?;
    let bx = e.mul(beta, x)?;
    let s = e.unary(UnaryOp::Logistic, bx);
    let one = e.c(1.0);
    let linear = e.compare(CompareDir::Gt, bx, threshold)?;
    e.select(linear, one, s)
}

/// elu(x) = scale x for x > 0, else scale alpha (exp(input_scale x) - 1).
fn elu(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let (alpha, scale, input_scale) = (e.scalar(1)?, e.scalar(2)?, e.scalar(3)?);
    let pos = e.positive(x)?;
    let sx = e.mul(input_scale, x)?;
    let em1 = e.unary(UnaryOp::Expm1, sx);
    let neg = e.mul(alpha, em1)?;
    let v = e.select(pos, x, neg)?;
    e.mul(scale, v)
}

/// elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result).
fn elu_grad(e: &mut Ew, y: ValueId) -> Result<ValueId> {
    let is_result = e.bool_arg(4)?;
    let (alpha, scale, input_scale) = (e.scalar(1)?, e.scalar(2)?, e.scalar(3)?);
    let pos = e.positive(y)?;
    let neg_grad = if is_result {
        // d/dx = input_scale (result + alpha scale)
        let a_s = e.mul(alpha, scale)?;
        let r = e.add(y, a_s)?;
        e.mul(input_scale, r)?
    } else {
        let sx = e.mul(input_scale, y)?;
        let ex = e.unary(UnaryOp::Exp, sx);
        let a_s = e.mul(alpha, scale)?;
        let t = e.mul(a_s, ex)?;
        e.mul(input_scale, t)?
    };
    e.select(pos, scale, neg_grad)
}

fn leaky_relu(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let slope = e.scalar(1)?;
    let pos = e.positive(x)?;
    let neg = e.mul(x, slope)?;
    e.select(pos, x, neg)
}

/// leaky_relu_backward(grad, self, negative_slope, self_is_result): the
/// factor 1 or the slope (grad * 1 is grad exactly).
fn leaky_relu_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let slope = e.scalar(2)?;
    let pos = e.positive(x)?;
    let one = e.c(1.0);
    e.select(pos, one, slope)
}

fn hardtanh(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let (lo, hi) = (e.scalar(1)?, e.scalar(2)?);
    let m = e.maximum(x, lo)?;
    e.minimum(m, hi)
}

/// Gradient passes only strictly inside (min_val, max_val).
fn hardtanh_backward(b: &mut Builder) -> Result<()> {
    let (g, x, dtype, dims) = grad_and_input(b, 0, 1)?;
    let wide = accumulate_dtype(dtype);
    let e = &mut Ew {
        b,
        dims,
        dtype: wide,
    };
    let (lo, hi) = (e.scalar(2)?, e.scalar(3)?);
    let above = e.compare(CompareDir::Gt, x, lo)?;
    let below = e.compare(CompareDir::Lt, x, hi)?;
    let inside = e.binary(BinaryOp::And, above, below)?;
    let zero = e.c(0.0);
    let out = e.select(inside, g, zero)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// x * min(max(x + 3, 0), 6) / 6.
fn hardswish(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let three = e.c(3.0);
    let zero = e.c(0.0);
    let six = e.c(6.0);
    let s = e.add(x, three)?;
    let r = e.maximum(s, zero)?;
    let r = e.minimum(r, six)?;
    let xr = e.mul(x, r)?;
    e.div(xr, six)
}

fn hardswish_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // ATen's: 0 at and below -3, 1 at and above 3, x / 3 + 1/2 between.
    let m3 = e.c(-3.0);
    let p3 = e.c(3.0);
    let zero = e.c(0.0);
    let one = e.c(1.0);
    let half = e.c(0.5);
    let third = e.div(x, p3)?;
    let mid = e.add(third, half)?;
    let low = e.compare(CompareDir::Le, x, m3)?;
    let high = e.compare(CompareDir::Ge, x, p3)?;
    let v = e.select(high, one, mid)?;
    e.select(low, zero, v)
}

/// tanh_backward(grad, output) = grad (1 - y²); sigmoid_backward(grad,
/// output) = grad y (1 - y): both from the forward's output.
fn output_backward(b: &mut Builder, tanh: bool) -> Result<()> {
    let (g, y, dtype, dims) = grad_and_input(b, 0, 1)?;
    let g = b.broadcast_to(g, &dims)?;
    let wide = accumulate_dtype(dtype);
    let e = &mut Ew {
        b,
        dims,
        dtype: wide,
    };
    let one = e.c(1.0);
    let d = if tanh {
        let y2 = e.mul(y, y)?;
        e.sub(one, y2)?
    } else {
        let omy = e.sub(one, y)?;
        e.mul(y, omy)?
    };
    let out = e.mul(g, d)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// threshold(self, threshold, value): x <= threshold ? value : x, so NaN
/// stays NaN, as in ATen.
fn threshold(b: &mut Builder, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let (dtype, dims) = (b.dtype(x), b.dims(x));
    let wide = accumulate_dtype(dtype);
    let x = b.convert(x, wide);
    let t = broadcast_scalar(b, 1, wide, &dims)?;
    let v = broadcast_scalar(b, 2, wide, &dims)?;
    let replace = b.compare(CompareDir::Le, x, t)?;
    let out = b.select(replace, v, x)?;
    let out = b.convert(out, dtype);
    finish(b, form, out)
}

/// self <= threshold ? 0 : grad (relu's backward; a NaN self passes grad).
fn threshold_backward(b: &mut Builder) -> Result<()> {
    let dtype = result_type(b, &[0, 1])?;
    let (g, x) = operand_pair(b, (0, 1), dtype)?;
    let dims = b.dims(x);
    let wide = accumulate_dtype(dtype);
    let x = b.convert(x, wide);
    let t = broadcast_scalar(b, 2, wide, &dims)?;
    let stop = b.compare(CompareDir::Le, x, t)?;
    let zero = b.constant(Literal::Int(0), dtype, &dims);
    let out = b.select(stop, zero, g)?;
    b.output(out)
}

/// softshrink / hardshrink (and their backwards with `grad` first). Values
/// inside [-lambd, lambd] shrink to zero, so a NaN stays NaN, as in ATen;
/// the backwards pass the gradient only outside it (a NaN input gets 0, as
/// ATen's vectorised kernels give). As in ATen's kernels, softshrink
/// computes 16-bit floats in float32 with lambd unrounded; hardshrink and
/// the backwards compare with lambd rounded to the input's dtype.
fn shrink(b: &mut Builder, soft: bool, pass: Pass) -> Result<()> {
    let xi = pass.first_arg();
    let x = b.tensor(xi)?;
    let (dtype, dims) = (b.dtype(x), b.dims(x));
    let compute = match (pass, soft) {
        (Pass::Forward, true) => accumulate_dtype(dtype),
        _ => dtype,
    };
    let x = b.convert(x, compute);
    let l = broadcast_scalar(b, xi + 1, compute, &dims)?;
    let nl = b.unary(UnaryOp::Neg, l);
    let above = b.compare(CompareDir::Gt, x, l)?;
    let below = b.compare(CompareDir::Lt, x, nl)?;
    let outside = b.binary(BinaryOp::Or, above, below)?;
    let zero = b.constant(Literal::Int(0), compute, &dims);
    let out = if pass == Pass::Backward {
        let g = b.tensor(0)?;
        let g = b.convert(g, dtype);
        b.select(outside, g, zero)?
    } else {
        let nan = b.is_nan(x)?;
        let rest = b.select(nan, x, zero)?;
        if soft {
            let xm = b.sub(x, l)?;
            let xp = b.add(x, l)?;
            let v = b.select(above, xm, rest)?;
            b.select(below, xp, v)?
        } else {
            b.select(outside, x, rest)?
        }
    };
    let out = b.convert(out, dtype);
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
    let zero = b.float_like(0.0, x);
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
    let (g, x, dtype, _) = grad_and_input(b, 0, 1)?;
    let nx = b.unary(UnaryOp::Neg, x);
    let s = b.unary(UnaryOp::Logistic, nx);
    let out = b.binary(BinaryOp::Mul, g, s)?;
    let out = b.convert(out, dtype);
    b.output(out)
}

/// glu(self, dim) = a * sigmoid(b) of the two halves; backward(grad, self, dim).
fn glu(b: &mut Builder, pass: Pass) -> Result<()> {
    let xi = pass.first_arg();
    let x = b.tensor(xi)?;
    let dims = b.dims(x);
    // wrap_dim accepts dim 0 of a 0-d tensor, which has no dim to halve.
    ensure(
        b,
        !dims.is_empty(),
        "input",
        "a tensor of at least 1 dimension",
        "a 0-d tensor",
    )?;
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
    if pass == Pass::Forward {
        let out = b.binary(BinaryOp::Mul, a, s)?;
        return b.output(out);
    }
    let g = b.tensor(0)?;
    let g = b.convert(g, b.dtype(x));
    let ga = b.binary(BinaryOp::Mul, g, s)?;
    let one = b.float_like(1.0, s);
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
    let zero = b.float_like(0.0, x);
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
    let zero = b.float_like(0.0, x);
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

pub(super) fn ops() -> Vec<OpDef> {
    use Form::Functional as F;
    let mut ops = vec![
        op!("aten::hardswish_backward", backward(0, 1, hardswish_grad)),
        op!("aten::mish_backward", backward(0, 1, mish_grad)),
        op!("aten::softshrink_backward", shrink(true, Pass::Backward)),
        op!("aten::hardshrink_backward", shrink(false, Pass::Backward)),
        op!("aten::log_sigmoid_forward", log_sigmoid()),
        op!("aten::_prelu_kernel", prelu()),
        op!("aten::_prelu_kernel_backward", prelu_backward()),
    ];
    ops.extend(backward_of!("aten::threshold", threshold_backward()));
    ops.extend(backward_of!("aten::tanh", output_backward(true)));
    ops.extend(backward_of!("aten::sigmoid", output_backward(false)));
    ops.extend(backward_of!("aten::gelu", gelu_backward()));
    ops.extend(backward_of!("aten::silu", backward(0, 1, silu_grad)));
    ops.extend(backward_of!(
        "aten::softplus",
        backward(0, 1, softplus_grad)
    ));
    ops.extend(backward_of!("aten::elu", backward(0, 5, elu_grad)));
    ops.extend(backward_of!(
        "aten::leaky_relu",
        backward(0, 1, leaky_relu_grad)
    ));
    ops.extend(backward_of!("aten::hardtanh", hardtanh_backward()));
    ops.extend(backward_of!("aten::log_sigmoid", log_sigmoid_backward()));
    ops.extend(forms!("aten::gelu", gelu()));
    ops.extend(forms!("aten::silu", forward(silu)));
    ops.extend(forms!("aten::elu", forward(elu)));
    ops.extend(forms!("aten::leaky_relu", forward(leaky_relu)));
    ops.extend(forms!("aten::hardtanh", forward(hardtanh)));
    ops.extend(forms!("aten::hardswish", forward(hardswish)));
    ops.extend(forms!("aten::threshold", threshold()));
    ops.extend(with_out!("aten::softplus", forward(softplus, F)));
    ops.extend(with_out!("aten::softshrink", shrink(true, Pass::Forward)));
    ops.extend(with_out!("aten::hardshrink", shrink(false, Pass::Forward)));
    ops.extend(with_backward!("aten::glu", glu()));
    ops
}
