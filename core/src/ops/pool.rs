//! Pooling (max with indices, average, adaptive average; with backwards),
//! max unpooling, and im2col/col2im. Windows are gathered from the
//! flattened input, so ceil_mode, padding and dilation follow ATen's index
//! arithmetic exactly; backwards scatter-add into the input.

use super::index::{host_values, plane_positions};
use super::{accumulate_dtype, ensure, float_input, output_as, Arith, OpDef};
use crate::builder::{Arg, Builder};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, ValueId};

/// 2-D pooling geometry.
struct Pool {
    /// Batch planes (N*C, or C for unbatched input).
    planes: i64,
    h: i64,
    w: i64,
    k: [i64; 2],
    s: [i64; 2],
    p: [i64; 2],
    d: [i64; 2],
    out: [i64; 2],
}

impl Pool {
    /// The windows of kernel `k`, stride `s`, padding `p` and dilation `d`
    /// over `planes` planes of `h` x `w`.
    fn new(
        planes: i64,
        [h, w]: [i64; 2],
        k: [i64; 2],
        s: [i64; 2],
        p: [i64; 2],
        d: [i64; 2],
        ceil: bool,
    ) -> Pool {
        let out = [0, 1].map(|i| output_size([h, w][i], k[i], s[i], p[i], d[i], ceil));
        Pool {
            planes,
            h,
            w,
            k,
            s,
            p,
            d,
            out,
        }
    }

    /// Whether there is at least one window along each spatial dim.
    fn has_windows(&self) -> bool {
        self.out.iter().all(|&o| o >= 1)
    }
}

fn pair(b: &Builder, index: usize, default: Option<[i64; 2]>) -> Result<[i64; 2]> {
    let v = match b.arg(index) {
        Ok(Arg::None) | Err(_) => vec![],
        Ok(_) => b.int_list_arg(index)?,
    };
    match (v.len(), default) {
        (0, Some(d)) => Ok(d),
        (1, _) => Ok([v[0], v[0]]),
        (2, _) => Ok([v[0], v[1]]),
        (n, _) => Err(b.arg_error(index, "1 or 2 values", n)),
    }
}

/// ATen's pooling output size, with ceil_mode's rule that the last window
/// must start inside the (left-padded) input.
/// Computed in 128 bits: with `check_geometry`'s bounds nothing overflows.
fn output_size(input: i64, k: i64, s: i64, p: i64, d: i64, ceil: bool) -> i64 {
    let [input, k, s, p, d] = [input, k, s, p, d].map(i128::from);
    let span = input + 2 * p - d * (k - 1) - 1;
    let mut out = if ceil {
        (span + s - 1).div_euclid(s) + 1
    } else {
        span.div_euclid(s) + 1
    };
    if ceil && (out - 1) * s >= input + p {
        out -= 1;
    }
    out.clamp(0, i64::MAX.into()) as i64
}

/// Largest kernel, stride, dilation or padding accepted: far past any real
/// image, and small enough that window arithmetic cannot overflow.
const MAX_GEOMETRY: i64 = 1 << 31;

/// Errors unless kernel, stride and dilation are in [1, 2^31) and padding
/// in [0, 2^31), and, for pooling (`half_kernel_padding`), padding is at
/// most half the kernel.
fn check_geometry(
    b: &Builder,
    [k, s, p, d]: [[i64; 2]; 4],
    half_kernel_padding: bool,
) -> Result<()> {
    let positive = |v: &i64| (1..MAX_GEOMETRY).contains(v);
    let ok = k.iter().chain(&s).chain(&d).all(positive)
        && p.iter().all(|v| (0..MAX_GEOMETRY).contains(v))
        && (!half_kernel_padding || (p[0] * 2 <= k[0] && p[1] * 2 <= k[1]));
    let expected = if half_kernel_padding {
        "kernel, stride, dilation in [1, 2^31) and 0 <= padding <= kernel / 2"
    } else {
        "kernel, stride, dilation in [1, 2^31) and padding in [0, 2^31)"
    };
    let got = format!("kernel {k:?} stride {s:?} padding {p:?} dilation {d:?}");
    ensure(b, ok, "geometry", expected, got)
}

/// An image's planes (its leading dims flattened), height and width.
fn planes_hw(sizes: &[i64]) -> (i64, i64, i64) {
    let r = sizes.len();
    (sizes[..r - 2].iter().product(), sizes[r - 2], sizes[r - 1])
}

/// Errors unless `sizes` are an image's: (N, C, H, W) or (C, H, W).
fn check_image(b: &Builder, sizes: &[i64]) -> Result<()> {
    let got = format!("{sizes:?}");
    ensure(
        b,
        (3..=4).contains(&sizes.len()),
        "input",
        "a 3-D or 4-D input",
        got,
    )
}

/// Errors unless a pooling backward's input (argument 1) is an image and
/// its gradient (argument 0) has the input's rank.
fn check_grad_image(b: &Builder, sizes: &[i64]) -> Result<()> {
    check_image(b, sizes)?;
    let grad = b.tensor_arg(0)?.view.sizes.len();
    let expected = format!("a {}-D gradient, as the input", sizes.len());
    ensure(
        b,
        grad == sizes.len(),
        "grad_output",
        expected,
        format!("{grad}-D"),
    )
}

/// Reads pooling arguments: input at 0, kernel at 1, stride at 2, padding
/// at 3, dilation at `dilation` (if any), ceil_mode at `ceil`.
fn pool_geometry(b: &Builder, dilation: Option<usize>, ceil: usize) -> Result<Pool> {
    let sizes = b.tensor_arg(0)?.view.sizes.clone();
    check_image(b, &sizes)?;
    let (planes, h, w) = planes_hw(&sizes);
    let k = pair(b, 1, None)?;
    let s = pair(b, 2, Some(k))?;
    let p = pair(b, 3, Some([0, 0]))?;
    let d = match dilation {
        Some(i) => pair(b, i, Some([1, 1]))?,
        None => [1, 1],
    };
    let ceil_mode = b.bool_arg(ceil)?;
    check_geometry(b, [k, s, p, d], true)?;
    let g = Pool::new(planes, [h, w], k, s, p, d, ceil_mode);
    let got = format!("{:?} for input {sizes:?}", g.out);
    ensure(b, g.has_windows(), "output size", "at least 1x1", got)?;
    Ok(g)
}

/// The output sizes (input sizes with the last two replaced).
fn out_sizes(input: &[i64], out: [i64; 2]) -> Vec<i64> {
    let mut v = input.to_vec();
    let r = v.len();
    v[r - 2] = out[0];
    v[r - 1] = out[1];
    v
}

/// For window element (kh, kw) of output (oh, ow): the input row/column.
/// Returns (rows, cols) as s64 tensors of shape [planes, OH, OW, KH, KW].
fn window_coords(b: &mut Builder, g: &Pool) -> Result<(ValueId, ValueId, Vec<i64>)> {
    let shape = vec![g.planes, g.out[0], g.out[1], g.k[0], g.k[1]];
    let coord = |b: &mut Builder,
                 out_dim: usize,
                 k_dim: usize,
                 s: i64,
                 p: i64,
                 d: i64|
     -> Result<ValueId> {
        let o = b.iota(DType::I64, &shape, out_dim);
        let k = b.iota(DType::I64, &shape, k_dim);
        let sv = b.constant(Literal::Int(s), DType::I64, &shape);
        let dv = b.constant(Literal::Int(d), DType::I64, &shape);
        let pv = b.constant(Literal::Int(p), DType::I64, &shape);
        let os = b.binary(BinaryOp::Mul, o, sv)?;
        let kd = b.binary(BinaryOp::Mul, k, dv)?;
        let sum = b.binary(BinaryOp::Add, os, kd)?;
        b.binary(BinaryOp::Sub, sum, pv)
    };
    let rows = coord(b, 1, 3, g.s[0], g.p[0], g.d[0])?;
    let cols = coord(b, 2, 4, g.s[1], g.p[1], g.d[1])?;
    Ok((rows, cols, shape))
}

/// `0 <= rows < h && 0 <= cols < w`, and the clamped flat input index.
fn window_index(
    b: &mut Builder,
    g: &Pool,
    rows: ValueId,
    cols: ValueId,
    shape: &[i64],
) -> Result<(ValueId, ValueId, ValueId)> {
    let zero = b.constant(Literal::Int(0), DType::I64, shape);
    let hv = b.constant(Literal::Int(g.h), DType::I64, shape);
    let wv = b.constant(Literal::Int(g.w), DType::I64, shape);
    let r0 = b.compare(CompareDir::Ge, rows, zero)?;
    let r1 = b.compare(CompareDir::Lt, rows, hv)?;
    let c0 = b.compare(CompareDir::Ge, cols, zero)?;
    let c1 = b.compare(CompareDir::Lt, cols, wv)?;
    let a = b.binary(BinaryOp::And, r0, r1)?;
    let c = b.binary(BinaryOp::And, c0, c1)?;
    let valid = b.binary(BinaryOp::And, a, c)?;
    let hmax = b.constant(Literal::Int(g.h - 1), DType::I64, shape);
    let wmax = b.constant(Literal::Int(g.w - 1), DType::I64, shape);
    let rc = b.binary(BinaryOp::Max, rows, zero)?;
    let rc = b.binary(BinaryOp::Min, rc, hmax)?;
    let cc = b.binary(BinaryOp::Max, cols, zero)?;
    let cc = b.binary(BinaryOp::Min, cc, wmax)?;
    let rw = b.binary(BinaryOp::Mul, rc, wv)?;
    let spatial = b.binary(BinaryOp::Add, rw, cc)?;
    let plane = b.iota(DType::I64, shape, 0);
    let hw = b.constant(Literal::Int(g.h * g.w), DType::I64, shape);
    let base = b.binary(BinaryOp::Mul, plane, hw)?;
    let flat = b.binary(BinaryOp::Add, base, spatial)?;
    Ok((valid, spatial, flat))
}

/// The float input (argument 0), flattened for gathers.
fn flat_input(b: &mut Builder) -> Result<(ValueId, DType, Dims)> {
    let (x, dtype, sizes) = float_input(b, 0)?;
    let x = b.reshape(x, &[sizes.iter().product()])?;
    Ok((x, dtype, sizes))
}

/// max_pool2d_with_indices(self, kernel, stride, padding, dilation, ceil_mode)
/// -> (out, indices into each input plane, h * W + w).
fn max_pool(b: &mut Builder) -> Result<()> {
    let g = pool_geometry(b, Some(4), 5)?;
    let (x, dtype, sizes) = flat_input(b)?;
    let (rows, cols, shape) = window_coords(b, &g)?;
    let (valid, spatial, flat) = window_index(b, &g, rows, cols, &shape)?;
    let values = b.flat_gather(x, flat);
    let neg_inf = b.constant(Literal::Float(f64::NEG_INFINITY), dtype, &shape);
    let values = b.select(valid, values, neg_inf)?;
    let best = b.reduce(values, ReduceOp::Max, &[3, 4]);
    let best_b = b.broadcast_in_dim(best, &shape, &[0, 1, 2]);
    let is_best = b.compare(CompareDir::Eq, values, best_b)?;
    let big = b.constant(Literal::Int(i64::MAX), DType::I64, &shape);
    // Window positions increase with the spatial index, so the smallest
    // spatial index among the maxima is the first maximum, as ATen picks.
    let candidates = b.select(is_best, spatial, big)?;
    // ATen's scan takes every NaN it meets: a window holding NaN gives NaN
    // at its last NaN. NaNs are candidates as -1 - spatial, below every
    // maximum's, so one min finds both (and says which it found).
    let nan = b.is_nan(values)?;
    let minus_one = b.constant(Literal::Int(-1), DType::I64, &shape);
    let nan_code = b.sub(minus_one, spatial)?;
    let candidates = b.select(nan, nan_code, candidates)?;
    let found = b.reduce(candidates, ReduceOp::Min, &[3, 4]);
    let out_dims = b.dims(found);
    let zero = b.constant(Literal::Int(0), DType::I64, &out_dims);
    let has_nan = b.compare(CompareDir::Lt, found, zero)?;
    let minus_one = b.constant(Literal::Int(-1), DType::I64, &out_dims);
    let last_nan = b.sub(minus_one, found)?;
    let index = b.select(has_nan, last_nan, found)?;
    let nan_value = b.float_like(f64::NAN, best);
    let best = b.select(has_nan, nan_value, best)?;
    output_as(b, &out_sizes(&sizes, g.out), &[best, index])
}

/// max_pool2d_with_indices_backward(grad, self, kernel, stride, padding,
/// dilation, ceil_mode, indices): gradients scatter-added at the indices.
fn max_pool_backward(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(1)?.view.clone();
    check_grad_image(b, &view.sizes)?;
    let (planes, h, w) = planes_hw(&view.sizes);
    let gy = b.tensor(0)?;
    let gdims = b.dims(gy);
    let per_plane: i64 = gdims[view.sizes.len() - 2..].iter().product();
    let gy = b.reshape(gy, &[planes, per_plane])?;
    let gy = b.convert(gy, view.dtype);
    let flat = plane_positions(b, 7, planes, per_plane, h * w)?;
    let zeros = b.constant(Literal::Int(0), view.dtype, &[planes * h * w]);
    let gx = b.flat_scatter_add(zeros, flat, gy);
    let gx = b.reshape(gx, &view.sizes)?;
    b.output(gx)
}

/// ATen's average-pool divisor per output position, as `dtype` [OH, OW].
fn avg_divisor(
    b: &mut Builder,
    g: &Pool,
    count_include_pad: bool,
    dtype: DType,
) -> Result<ValueId> {
    let mut per_axis = Vec::new();
    for axis in 0..2 {
        let (n, size) = (g.out[axis], if axis == 0 { g.h } else { g.w });
        let o = b.iota(DType::I64, &[n], 0);
        let s = b.constant(Literal::Int(g.s[axis]), DType::I64, &[n]);
        let p = b.constant(Literal::Int(g.p[axis]), DType::I64, &[n]);
        let k = b.constant(Literal::Int(g.k[axis]), DType::I64, &[n]);
        let limit = b.constant(Literal::Int(size + g.p[axis]), DType::I64, &[n]);
        let os = b.binary(BinaryOp::Mul, o, s)?;
        let start = b.binary(BinaryOp::Sub, os, p)?;
        let sk = b.binary(BinaryOp::Add, start, k)?;
        let end = b.binary(BinaryOp::Min, sk, limit)?;
        let len = if count_include_pad {
            b.binary(BinaryOp::Sub, end, start)?
        } else {
            let zero = b.constant(Literal::Int(0), DType::I64, &[n]);
            let sz = b.constant(Literal::Int(size), DType::I64, &[n]);
            let cs = b.binary(BinaryOp::Max, start, zero)?;
            let ce = b.binary(BinaryOp::Min, end, sz)?;
            b.binary(BinaryOp::Sub, ce, cs)?
        };
        per_axis.push(len);
    }
    let rows = b.broadcast_in_dim(per_axis[0], &[g.out[0], g.out[1]], &[0]);
    let cols = b.broadcast_in_dim(per_axis[1], &[g.out[0], g.out[1]], &[1]);
    let area = b.binary(BinaryOp::Mul, rows, cols)?;
    Ok(b.convert(area, dtype))
}

/// The divisor for avg_pool2d(+backward) with divisor_override at `index`.
fn divisor(
    b: &mut Builder,
    g: &Pool,
    include_pad: usize,
    divisor_override: usize,
    dtype: DType,
) -> Result<ValueId> {
    match b.opt_int_arg(divisor_override)? {
        Some(0) => Err(b.arg_error(divisor_override, "a non-zero divisor", 0)),
        Some(v) => Ok(b.constant(Literal::Int(v), dtype, &[g.out[0], g.out[1]])),
        None => {
            let include = b.bool_arg(include_pad)?;
            avg_divisor(b, g, include, dtype)
        }
    }
}

/// avg_pool2d(self, kernel, stride, padding, ceil_mode, count_include_pad,
/// divisor_override).
fn avg_pool(b: &mut Builder) -> Result<()> {
    let g = pool_geometry(b, None, 4)?;
    let (x, dtype, sizes) = flat_input(b)?;
    let (rows, cols, shape) = window_coords(b, &g)?;
    let (valid, _, flat) = window_index(b, &g, rows, cols, &shape)?;
    // 16-bit inputs sum in float32, as ATen does.
    let acc = accumulate_dtype(dtype);
    let x = b.convert(x, acc);
    let values = b.flat_gather(x, flat);
    let zeros = b.constant(Literal::Int(0), acc, &shape);
    let values = b.select(valid, values, zeros)?;
    let sum = b.reduce(values, ReduceOp::Sum, &[3, 4]);
    let div = divisor(b, &g, 5, 6, acc)?;
    let div = b.broadcast_in_dim(div, &[g.planes, g.out[0], g.out[1]], &[1, 2]);
    let out = b.binary(BinaryOp::Div, sum, div)?;
    let out = b.convert(out, dtype);
    let out = b.reshape(out, &out_sizes(&sizes, g.out))?;
    b.output(out)
}

/// avg_pool2d_backward(grad, self, kernel, stride, padding, ceil_mode,
/// count_include_pad, divisor_override).
fn avg_pool_backward(b: &mut Builder) -> Result<()> {
    // The forward's arguments follow the gradient, one position later.
    let view = b.tensor_arg(1)?.view.clone();
    check_grad_image(b, &view.sizes)?;
    let (planes, h, w) = planes_hw(&view.sizes);
    let k = pair(b, 2, None)?;
    let s = pair(b, 3, Some(k))?;
    let p = pair(b, 4, Some([0, 0]))?;
    let ceil_mode = b.bool_arg(5)?;
    check_geometry(b, [k, s, p, [1, 1]], true)?;
    let g = Pool::new(planes, [h, w], k, s, p, [1, 1], ceil_mode);
    let out = g.out;
    let dtype = view.dtype;
    let gy = b.tensor(0)?;
    let gy = b.convert(gy, dtype);
    let gy = b.reshape(gy, &[planes, out[0], out[1]])?;
    let div = divisor(b, &g, 6, 7, dtype)?;
    let div = b.broadcast_in_dim(div, &[planes, out[0], out[1]], &[1, 2]);
    let share = b.binary(BinaryOp::Div, gy, div)?;
    let (rows, cols, shape) = window_coords(b, &g)?;
    let (valid, _, flat) = window_index(b, &g, rows, cols, &shape)?;
    let share = b.broadcast_in_dim(share, &shape, &[0, 1, 2]);
    let zeros = b.constant(Literal::Int(0), dtype, &shape);
    let share = b.select(valid, share, zeros)?;
    let acc = b.constant(Literal::Int(0), dtype, &[planes * h * w]);
    let gx = b.flat_scatter_add(acc, flat, share);
    let gx = b.reshape(gx, &view.sizes)?;
    b.output(gx)
}

/// The adaptive pooling matrix [out, size]: row i averages input
/// [floor(i size / out), ceil((i + 1) size / out)).
fn adaptive_matrix(b: &mut Builder, out: i64, size: i64, dtype: DType) -> Result<ValueId> {
    let shape = [out, size];
    let i = b.iota(DType::I64, &shape, 0);
    let j = b.iota(DType::I64, &shape, 1);
    let n = b.constant(Literal::Int(size), DType::I64, &shape);
    let o = b.constant(Literal::Int(out), DType::I64, &shape);
    let one = b.constant(Literal::Int(1), DType::I64, &shape);
    let in_ = b.binary(BinaryOp::Mul, i, n)?;
    let start = b.binary(BinaryOp::Div, in_, o)?;
    let i1 = b.binary(BinaryOp::Add, i, one)?;
    let i1n = b.binary(BinaryOp::Mul, i1, n)?;
    let om1 = b.binary(BinaryOp::Sub, o, one)?;
    let up = b.binary(BinaryOp::Add, i1n, om1)?;
    let end = b.binary(BinaryOp::Div, up, o)?;
    let ge = b.compare(CompareDir::Ge, j, start)?;
    let lt = b.compare(CompareDir::Lt, j, end)?;
    let inside = b.binary(BinaryOp::And, ge, lt)?;
    let len = b.binary(BinaryOp::Sub, end, start)?;
    let len = b.convert(len, dtype);
    let onef = b.constant(Literal::Int(1), dtype, &shape);
    let weight = b.binary(BinaryOp::Div, onef, len)?;
    let zero = b.constant(Literal::Int(0), dtype, &shape);
    b.select(inside, weight, zero)
}

/// _adaptive_avg_pool2d(self, output_size): P_h x P_wᵀ per plane.
fn adaptive_avg_pool(b: &mut Builder) -> Result<()> {
    let (x, dtype, sizes) = flat_input(b)?;
    check_image(b, &sizes)?;
    let out = pair(b, 1, None)?;
    let (planes, h, w) = planes_hw(&sizes);
    let x = b.reshape(x, &[planes, h, w])?;
    let ph = adaptive_matrix(b, out[0], h, dtype)?;
    let pw = adaptive_matrix(b, out[1], w, dtype)?;
    let t = b.dot(x, pw, (&[], &[]), (&[2], &[1]), dtype)?; // [planes, h, ow]
    let y = b.dot(ph, t, (&[], &[]), (&[1], &[1]), dtype)?; // [oh, planes, ow]
    let y = b.transpose(y, &[1, 0, 2]);
    let y = b.reshape(y, &out_sizes(&sizes, out))?;
    b.output(y)
}

/// _adaptive_avg_pool2d_backward(grad, self): P_hᵀ g P_w per plane.
fn adaptive_avg_pool_backward(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(1)?.view.clone();
    check_grad_image(b, &view.sizes)?;
    let (planes, h, w) = planes_hw(&view.sizes);
    let gy = b.tensor(0)?;
    let gd = b.dims(gy);
    let (oh, ow) = (gd[gd.len() - 2], gd[gd.len() - 1]);
    let gy = b.convert(gy, view.dtype);
    let gy = b.reshape(gy, &[planes, oh, ow])?;
    let ph = adaptive_matrix(b, oh, h, view.dtype)?;
    let pw = adaptive_matrix(b, ow, w, view.dtype)?;
    let t = b.dot(gy, pw, (&[], &[]), (&[2], &[0]), view.dtype)?; // [planes, oh, w]
    let gx = b.dot(ph, t, (&[], &[]), (&[0], &[1]), view.dtype)?; // [h, planes, w]
    let gx = b.transpose(gx, &[1, 0, 2]);
    let gx = b.reshape(gx, &view.sizes)?;
    b.output(gx)
}

/// The im2col/col2im geometry: input (N, C, H, W) or (C, H, W) at
/// `sizes`, kernel/dilation/padding/stride at `first`.. (ATen's order).
fn patch_geometry(b: &Builder, sizes: &[i64], first: usize) -> Result<(Pool, i64, i64)> {
    check_image(b, sizes)?;
    let r = sizes.len();
    let (n, c) = if r == 4 {
        (sizes[0], sizes[1])
    } else {
        (1, sizes[0])
    };
    let k = pair(b, first, None)?;
    let d = pair(b, first + 1, Some([1, 1]))?;
    let p = pair(b, first + 2, Some([0, 0]))?;
    let s = pair(b, first + 3, Some([1, 1]))?;
    check_geometry(b, [k, s, p, d], false)?;
    let (h, w) = (sizes[r - 2], sizes[r - 1]);
    let g = Pool::new(n * c, [h, w], k, s, p, d, false);
    let got = format!("{:?}", g.out);
    ensure(b, g.has_windows(), "geometry", "at least one block", got)?;
    Ok((g, n, c))
}

/// im2col(self, kernel_size, dilation, padding, stride) -> [N, C*kh*kw, L]
/// (nn.Unfold): every sliding block as a column, zeros where it overlaps
/// the padding.
fn im2col(b: &mut Builder) -> Result<()> {
    let (x, dtype, sizes) = flat_input(b)?;
    let (g, n, c) = patch_geometry(b, &sizes, 1)?;
    let (rows, cols, shape) = window_coords(b, &g)?;
    let (valid, _, flat) = window_index(b, &g, rows, cols, &shape)?;
    let values = b.flat_gather(x, flat);
    let zeros = b.constant(Literal::Int(0), dtype, &shape);
    let values = b.select(valid, values, zeros)?;
    // [N*C, OH, OW, KH, KW] → [N, C, KH, KW, OH, OW] → [N, C*KH*KW, OH*OW]
    let values = b.reshape(values, &[n, c, g.out[0], g.out[1], g.k[0], g.k[1]])?;
    let values = b.transpose(values, &[0, 1, 4, 5, 2, 3]);
    let mut out = vec![n, c * g.k[0] * g.k[1], g.out[0] * g.out[1]];
    if sizes.len() == 3 {
        out.remove(0);
    }
    let values = b.reshape(values, &out)?;
    b.output(values)
}

/// col2im(self, output_size, kernel_size, dilation, padding, stride)
/// (nn.Fold): columns summed back into their blocks' positions.
fn col2im(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let got = format!("{:?}", view.sizes);
    ensure(
        b,
        (2..=3).contains(&view.sizes.len()),
        "input",
        "a 2-D or 3-D input",
        got,
    )?;
    let output_size = pair(b, 1, None)?;
    let batched = view.sizes.len() == 3;
    let (n, ckk) = if batched {
        (view.sizes[0], view.sizes[1])
    } else {
        (1, view.sizes[0])
    };
    let k = pair(b, 2, None)?;
    let valid = k.iter().all(|v| (1..MAX_GEOMETRY).contains(v));
    ensure(
        b,
        valid,
        "kernel_size",
        "sizes in [1, 2^31)",
        format!("{k:?}"),
    )?;
    if ckk % (k[0] * k[1]) != 0 {
        return Err(b.arg_error(
            0,
            format!("a channel dim divisible by {}", k[0] * k[1]),
            ckk,
        ));
    }
    let c = ckk / (k[0] * k[1]);
    let image = if batched {
        vec![n, c, output_size[0], output_size[1]]
    } else {
        vec![c, output_size[0], output_size[1]]
    };
    let (g, _, _) = patch_geometry(b, &image, 2)?;
    let blocks = *view.sizes.last().unwrap_or(&0);
    if blocks != g.out[0] * g.out[1] {
        return Err(b.arg_error(
            0,
            format!(
                "{} blocks for output size {output_size:?}",
                g.out[0] * g.out[1]
            ),
            blocks,
        ));
    }
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[n, c, g.k[0], g.k[1], g.out[0], g.out[1]])?;
    let x = b.transpose(x, &[0, 1, 4, 5, 2, 3]);
    let (rows, cols, shape) = window_coords(b, &g)?;
    let x = b.reshape(x, &shape)?;
    let (valid, _, flat) = window_index(b, &g, rows, cols, &shape)?;
    let zeros = b.constant(Literal::Int(0), view.dtype, &shape);
    let x = b.select(valid, x, zeros)?;
    let acc = b.constant(Literal::Int(0), view.dtype, &[g.planes * g.h * g.w]);
    let out = b.flat_scatter_add(acc, flat, x);
    let out = b.reshape(out, &image)?;
    b.output(out)
}

/// max_unpool2d(self, indices, output_size) / max_unpool3d(self, indices,
/// output_size, stride, padding): values placed at their indices within
/// each output plane, zeros elsewhere.
fn max_unpool(b: &mut Builder, k: usize) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let out = b.int_list_arg(2)?;
    if out.len() != k || view.sizes.len() < k + 1 {
        return Err(b.arg_error(
            2,
            format!("{k} output sizes for a ({})-D or more input", k + 1),
            format!("{out:?}"),
        ));
    }
    let r = view.sizes.len();
    let planes: i64 = view.sizes[..r - k].iter().product();
    let per_plane_in: i64 = view.sizes[r - k..].iter().product();
    let per_plane_out: i64 = out.iter().product();
    let index = b.tensor_arg(1)?.clone();
    let values = host_values(&index)?;
    if let Some(bad) = values.iter().find(|&&v| v < 0 || v >= per_plane_out) {
        return Err(b.arg_error(
            1,
            format!("indices in [0, {per_plane_out})"),
            format!("index {bad} is out of bounds"),
        ));
    }
    let x = b.tensor(0)?;
    let x = b.reshape(x, &[planes, per_plane_in])?;
    let flat = plane_positions(b, 1, planes, per_plane_in, per_plane_out)?;
    let zeros = b.constant(Literal::Int(0), view.dtype, &[planes * per_plane_out]);
    let y = b.flat_scatter(zeros, flat, x, None);
    let mut sizes = view.sizes[..r - k].to_vec();
    sizes.extend(&out);
    let y = b.reshape(y, &sizes)?;
    b.output(y)
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = vec![
        op!("aten::max_pool2d_with_indices", max_pool()),
        op!(
            "aten::max_pool2d_with_indices_backward",
            max_pool_backward()
        ),
        op!("aten::avg_pool2d", avg_pool()),
        op!("aten::avg_pool2d_backward", avg_pool_backward()),
        op!("aten::_adaptive_avg_pool2d", adaptive_avg_pool()),
        op!(
            "aten::_adaptive_avg_pool2d_backward",
            adaptive_avg_pool_backward()
        ),
    ];
    ops.extend(with_out!("aten::im2col", im2col()));
    ops.extend(with_out!("aten::col2im", col2im()));
    ops.extend(with_out!("aten::max_unpool2d", max_unpool(2)));
    ops.extend(with_out!("aten::max_unpool3d", max_unpool(3)));
    ops
}
