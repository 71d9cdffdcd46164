//! Activations and their backwards: gelu (exact and tanh), silu, softplus,
//! elu, leaky_relu, hardtanh, hardswish.

use super::{finish, is_float, op, Form, OpDef};
use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, UnaryOp, ValueId};

/// Small arithmetic helpers over values of one shape and dtype.
struct Ew<'b, 'a> {
    b: &'b mut Builder<'a>,
    dims: Vec<i64>,
    dtype: DType,
}

impl Ew<'_, '_> {
    fn c(&mut self, v: f64) -> ValueId {
        self.b.constant(Literal::Float(v), self.dtype, &self.dims)
    }
    fn scalar(&mut self, index: usize) -> Result<ValueId> {
        let s = self.b.scalar_arg(index, self.dtype)?;
        self.b.broadcast_to(s, &self.dims)
    }
    fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.b.binary(BinaryOp::Add, x, y)
    }
    fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.b.binary(BinaryOp::Sub, x, y)
    }
    fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.b.binary(BinaryOp::Mul, x, y)
    }
    fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.b.binary(BinaryOp::Div, x, y)
    }
    fn un(&mut self, op: UnaryOp, x: ValueId) -> ValueId {
        self.b.unary(op, x)
    }
    fn gt(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.b.compare(CompareDir::Gt, x, y)
    }
    fn lt(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.b.compare(CompareDir::Lt, x, y)
    }
    fn select(&mut self, p: ValueId, t: ValueId, f: ValueId) -> Result<ValueId> {
        self.b.select(p, t, f)
    }
}

/// Reads float tensor argument `index`.
fn float_input(b: &mut Builder, index: usize) -> Result<(ValueId, DType, Vec<i64>)> {
    let view = b.tensor_arg(index)?.view.clone();
    if !is_float(view.dtype) {
        return Err(Error::invalid(
            format!("{}: input", b.op_name()),
            "a floating point tensor",
            view.dtype,
        ));
    }
    let x = b.tensor(index)?;
    Ok((x, view.dtype, view.sizes))
}

/// Forward activation on argument 0; `f` computes it on (x).
fn forward(b: &mut Builder, form: Form, f: fn(&mut Ew, ValueId) -> Result<ValueId>) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let out = f(&mut Ew { b, dims, dtype }, x)?;
    finish(b, form, out)
}

/// Backward `grad * f'(x)` with grad at `grad_index`, x at `x_index`.
fn backward(
    b: &mut Builder,
    grad_index: usize,
    x_index: usize,
    f: fn(&mut Ew, ValueId) -> Result<ValueId>,
) -> Result<()> {
    let (x, dtype, dims) = float_input(b, x_index)?;
    let g = b.tensor(grad_index)?;
    let g = b.convert(g, dtype);
    let g = b.broadcast_to(g, &dims)?;
    let d = f(&mut Ew { b, dims, dtype }, x)?;
    let out = b.binary(BinaryOp::Mul, g, d)?;
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

fn gelu_exact(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let r = e.c(std::f64::consts::FRAC_1_SQRT_2);
    let xr = e.mul(x, r)?;
    let erf = e.un(UnaryOp::Erf, xr);
    let one = e.c(1.0);
    let half = e.c(0.5);
    let s = e.add(one, erf)?;
    let hx = e.mul(half, x)?;
    e.mul(hx, s)
}

fn gelu_tanh_inner(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let c = e.c(GELU_CUBIC);
    let k = e.c(SQRT_2_OVER_PI);
    let x2 = e.mul(x, x)?;
    let x3 = e.mul(x2, x)?;
    let cx3 = e.mul(c, x3)?;
    let s = e.add(x, cx3)?;
    e.mul(k, s)
}

fn gelu_tanh(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    let inner = gelu_tanh_inner(e, x)?;
    let t = e.un(UnaryOp::Tanh, inner);
    let one = e.c(1.0);
    let half = e.c(0.5);
    let s = e.add(one, t)?;
    let hx = e.mul(half, x)?;
    e.mul(hx, s)
}

fn gelu_exact_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // Φ(x) + x φ(x)
    let r = e.c(std::f64::consts::FRAC_1_SQRT_2);
    let xr = e.mul(x, r)?;
    let erf = e.un(UnaryOp::Erf, xr);
    let one = e.c(1.0);
    let half = e.c(0.5);
    let s = e.add(one, erf)?;
    let cdf = e.mul(half, s)?;
    let x2 = e.mul(x, x)?;
    let mhalf = e.c(-0.5);
    let ex = e.mul(mhalf, x2)?;
    let ex = e.un(UnaryOp::Exp, ex);
    let norm = e.c(1.0 / (2.0 * std::f64::consts::PI).sqrt());
    let pdf = e.mul(norm, ex)?;
    let xpdf = e.mul(x, pdf)?;
    e.add(cdf, xpdf)
}

fn gelu_tanh_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // 0.5(1 + t) + 0.5 x (1 - t²) k (1 + 3c x²)
    let inner = gelu_tanh_inner(e, x)?;
    let t = e.un(UnaryOp::Tanh, inner);
    let one = e.c(1.0);
    let half = e.c(0.5);
    let opt = e.add(one, t)?;
    let left = e.mul(half, opt)?;
    let t2 = e.mul(t, t)?;
    let sech2 = e.sub(one, t2)?;
    let x2 = e.mul(x, x)?;
    let c3 = e.c(3.0 * GELU_CUBIC);
    let c3x2 = e.mul(c3, x2)?;
    let poly = e.add(one, c3x2)?;
    let k = e.c(SQRT_2_OVER_PI);
    let kp = e.mul(k, poly)?;
    let hx = e.mul(half, x)?;
    let a = e.mul(hx, sech2)?;
    let right = e.mul(a, kp)?;
    e.add(left, right)
}

fn gelu(b: &mut Builder, form: Form) -> Result<()> {
    if tanh_approximation(b, 1)? {
        forward(b, form, gelu_tanh)
    } else {
        forward(b, form, gelu_exact)
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
    let s = e.un(UnaryOp::Logistic, x);
    e.mul(x, s)
}

fn silu_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // s (1 + x (1 - s))
    let s = e.un(UnaryOp::Logistic, x);
    let one = e.c(1.0);
    let oms = e.sub(one, s)?;
    let xo = e.mul(x, oms)?;
    let p = e.add(one, xo)?;
    e.mul(s, p)
}

/// softplus(x) = log1p(exp(beta x)) / beta, or x where beta x > threshold.
fn softplus(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let e = &mut Ew { b, dims, dtype };
    let beta = e.scalar(1)?;
    let threshold = e.scalar(2)?;
    let bx = e.mul(beta, x)?;
    let ex = e.un(UnaryOp::Exp, bx);
    let l = e.un(UnaryOp::Log1p, ex);
    let soft = e.div(l, beta)?;
    let linear = e.gt(bx, threshold)?;
    let out = e.select(linear, x, soft)?;
    b.output(out)
}

fn softplus_backward(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 1)?;
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let e = &mut Ew { b, dims, dtype };
    let beta = e.scalar(2)?;
    let threshold = e.scalar(3)?;
    let bx = e.mul(beta, x)?;
    let s = e.un(UnaryOp::Logistic, bx);
    let one = e.c(1.0);
    let linear = e.gt(bx, threshold)?;
    let d = e.select(linear, one, s)?;
    let out = e.mul(g, d)?;
    b.output(out)
}

/// elu(x) = scale x for x > 0, else scale alpha (exp(input_scale x) - 1).
fn elu(b: &mut Builder, form: Form) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let e = &mut Ew { b, dims, dtype };
    let (alpha, scale, input_scale) = (e.scalar(1)?, e.scalar(2)?, e.scalar(3)?);
    let zero = e.c(0.0);
    let pos = e.gt(x, zero)?;
    let sx = e.mul(input_scale, x)?;
    let em1 = e.un(UnaryOp::Expm1, sx);
    let neg = e.mul(alpha, em1)?;
    let v = e.select(pos, x, neg)?;
    let out = e.mul(scale, v)?;
    finish(b, form, out)
}

/// elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result).
fn elu_backward(b: &mut Builder) -> Result<()> {
    let (y, dtype, dims) = float_input(b, 5)?;
    let is_result = b.bool_arg(4)?;
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let e = &mut Ew { b, dims, dtype };
    let (alpha, scale, input_scale) = (e.scalar(1)?, e.scalar(2)?, e.scalar(3)?);
    let zero = e.c(0.0);
    let pos = e.gt(y, zero)?;
    let neg_grad = if is_result {
        // d/dx = input_scale (result + alpha scale)
        let a_s = e.mul(alpha, scale)?;
        let r = e.add(y, a_s)?;
        e.mul(input_scale, r)?
    } else {
        let sx = e.mul(input_scale, y)?;
        let ex = e.un(UnaryOp::Exp, sx);
        let a_s = e.mul(alpha, scale)?;
        let t = e.mul(a_s, ex)?;
        e.mul(input_scale, t)?
    };
    let d = e.select(pos, scale, neg_grad)?;
    let out = e.mul(g, d)?;
    b.output(out)
}

fn leaky_relu(b: &mut Builder, form: Form) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let e = &mut Ew { b, dims, dtype };
    let slope = e.scalar(1)?;
    let zero = e.c(0.0);
    let pos = e.gt(x, zero)?;
    let neg = e.mul(x, slope)?;
    let out = e.select(pos, x, neg)?;
    finish(b, form, out)
}

/// leaky_relu_backward(grad, self, negative_slope, self_is_result).
fn leaky_relu_backward(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 1)?;
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let e = &mut Ew { b, dims, dtype };
    let slope = e.scalar(2)?;
    let zero = e.c(0.0);
    let pos = e.gt(x, zero)?;
    let neg = e.mul(g, slope)?;
    let out = e.select(pos, g, neg)?;
    b.output(out)
}

fn hardtanh(b: &mut Builder, form: Form) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 0)?;
    let e = &mut Ew { b, dims, dtype };
    let (lo, hi) = (e.scalar(1)?, e.scalar(2)?);
    let m = e.b.binary(BinaryOp::Max, x, lo)?;
    let out = e.b.binary(BinaryOp::Min, m, hi)?;
    finish(b, form, out)
}

/// Gradient passes only strictly inside (min_val, max_val).
fn hardtanh_backward(b: &mut Builder) -> Result<()> {
    let (x, dtype, dims) = float_input(b, 1)?;
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let e = &mut Ew { b, dims, dtype };
    let (lo, hi) = (e.scalar(2)?, e.scalar(3)?);
    let above = e.gt(x, lo)?;
    let below = e.lt(x, hi)?;
    let inside = e.b.binary(BinaryOp::And, above, below)?;
    let zero = e.c(0.0);
    let out = e.select(inside, g, zero)?;
    b.output(out)
}

fn hardswish(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // x * min(max(x + 3, 0), 6) / 6
    let three = e.c(3.0);
    let zero = e.c(0.0);
    let six = e.c(6.0);
    let s = e.add(x, three)?;
    let r = e.b.binary(BinaryOp::Max, s, zero)?;
    let r = e.b.binary(BinaryOp::Min, r, six)?;
    let xr = e.mul(x, r)?;
    e.div(xr, six)
}

fn hardswish_grad(e: &mut Ew, x: ValueId) -> Result<ValueId> {
    // 0 below -3, 1 above 3, (2x + 3) / 6 between (ATen's boundaries).
    let m3 = e.c(-3.0);
    let p3 = e.c(3.0);
    let zero = e.c(0.0);
    let one = e.c(1.0);
    let two = e.c(2.0);
    let six = e.c(6.0);
    let tx = e.mul(two, x)?;
    let n = e.add(tx, p3)?;
    let mid = e.div(n, six)?;
    let low = e.lt(x, m3)?;
    let high = e.gt(x, p3)?;
    let v = e.select(high, one, mid)?;
    e.select(low, zero, v)
}

/// tanh_backward(grad, output) = grad (1 - y²); sigmoid_backward(grad,
/// output) = grad y (1 - y): both from the forward's output.
fn output_backward(b: &mut Builder, tanh: bool) -> Result<()> {
    let (y, dtype, dims) = float_input(b, 1)?;
    let g = b.tensor(0)?;
    let g = b.convert(g, dtype);
    let g = b.broadcast_to(g, &dims)?;
    let e = &mut Ew { b, dims, dtype };
    let one = e.c(1.0);
    let d = if tanh {
        let y2 = e.mul(y, y)?;
        e.sub(one, y2)?
    } else {
        let omy = e.sub(one, y)?;
        e.mul(y, omy)?
    };
    let out = e.mul(g, d)?;
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    use Form::{Functional as F, InPlace as I};
    vec![
        op("aten::tanh_backward", |b| output_backward(b, true)),
        op("aten::tanh_backward.grad_input", |b| {
            output_backward(b, true)
        }),
        op("aten::sigmoid_backward", |b| output_backward(b, false)),
        op("aten::sigmoid_backward.grad_input", |b| {
            output_backward(b, false)
        }),
        op("aten::gelu", |b| gelu(b, F)),
        op("aten::gelu.out", |b| gelu(b, F)),
        op("aten::gelu_", |b| gelu(b, I)),
        op("aten::gelu_backward", gelu_backward),
        op("aten::gelu_backward.grad_input", gelu_backward),
        op("aten::silu", |b| forward(b, F, silu)),
        op("aten::silu.out", |b| forward(b, F, silu)),
        op("aten::silu_", |b| forward(b, I, silu)),
        op("aten::silu_backward", |b| backward(b, 0, 1, silu_grad)),
        op("aten::silu_backward.grad_input", |b| {
            backward(b, 0, 1, silu_grad)
        }),
        op("aten::softplus", softplus),
        op("aten::softplus.out", softplus),
        op("aten::softplus_backward", softplus_backward),
        op("aten::softplus_backward.grad_input", softplus_backward),
        op("aten::elu", |b| elu(b, F)),
        op("aten::elu.out", |b| elu(b, F)),
        op("aten::elu_", |b| elu(b, I)),
        op("aten::elu_backward", elu_backward),
        op("aten::elu_backward.grad_input", elu_backward),
        op("aten::leaky_relu", |b| leaky_relu(b, F)),
        op("aten::leaky_relu.out", |b| leaky_relu(b, F)),
        op("aten::leaky_relu_", |b| leaky_relu(b, I)),
        op("aten::leaky_relu_backward", leaky_relu_backward),
        op("aten::leaky_relu_backward.grad_input", leaky_relu_backward),
        op("aten::hardtanh", |b| hardtanh(b, F)),
        op("aten::hardtanh.out", |b| hardtanh(b, F)),
        op("aten::hardtanh_", |b| hardtanh(b, I)),
        op("aten::hardtanh_backward", hardtanh_backward),
        op("aten::hardtanh_backward.grad_input", hardtanh_backward),
        op("aten::hardswish", |b| forward(b, F, hardswish)),
        op("aten::hardswish.out", |b| forward(b, F, hardswish)),
        op("aten::hardswish_", |b| forward(b, I, hardswish)),
        op("aten::hardswish_backward", |b| {
            backward(b, 0, 1, hardswish_grad)
        }),
    ]
}
