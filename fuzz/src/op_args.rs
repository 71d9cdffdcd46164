//! Drawing an op's arguments from fuzz bytes, by its ATen schema.
//!
//! Random bytes alone almost never make a call rtpu accepts (shapes must
//! broadcast, dims must be in range, index tensors must hold indices), so
//! the draw is biased towards well-formed calls: one call shares a dtype
//! and a shape that most tensors take or derive from (broadcast, matrix
//! transpose, channel vector), ints named `dim` fall in the rank's range,
//! `index` tensors hold in-range indices, defaults are taken often. Every
//! choice still sometimes goes wrong on purpose: another dtype or shape,
//! 0-size and huge dims, strided, offset, expanded, aliased and invalid
//! views, extreme numbers, None, and an argument of the wrong kind.

use arbitrary::Unstructured;
use half::{bf16, f16};
use rtpu::ops::*;
use rtpu::storage::rtpu_tensor_ref;

use crate::schema::{Base, OpSchema, Param};
use crate::tensors::{arg, copy_ref, dtype_size, Arena};

/// Tensors are at most this many elements of storage; larger shapes are
/// made as expanded (stride 0) views.
const MAX_STORED: i64 = 1 << 12;

/// Ints worth trying anywhere. The large ones are past any device's
/// memory as sizes (rtpu must refuse them); sizes that would fit but
/// take gigabytes (2^31) are left out: they are valid, and would only
/// exhaust the fuzzer's memory.
const EDGE_INTS: [i64; 12] = [
    0,
    1,
    -1,
    2,
    3,
    -2,
    1 << 40,
    -(1 << 31),
    1 << 62,
    i64::MAX,
    i64::MIN,
    -(1 << 40),
];

/// Floats worth trying anywhere.
const EDGE_FLOATS: [f64; 12] = [
    0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    1e-5,
    -0.0,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e300,
    f64::MIN_POSITIVE,
];

/// Strings the ops' `str` arguments take, and some they do not.
const WORDS: [&str; 16] = [
    "mean",
    "sum",
    "none",
    "trunc",
    "floor",
    "tanh",
    "amax",
    "amin",
    "prod",
    "left",
    "right",
    "reflect",
    "constant",
    "replicate",
    "",
    "bogus",
];

/// Dtypes a call is based on, weighted towards float32.
const DTYPES: [u32; 20] = [
    12, 12, 12, 12, 12, 12, 13, 10, 11, 5, 5, 4, 1, 6, 2, 3, 7, 8, 14, 15,
];

/// The draw: fuzz bytes, then a cheap generator for bulk tensor contents.
pub struct Draw<'a, 'b> {
    u: &'b mut Unstructured<'a>,
}

impl<'a, 'b> Draw<'a, 'b> {
    pub fn new(u: &'b mut Unstructured<'a>) -> Self {
        Draw { u }
    }

    /// An index below `n` (0 when the bytes run out).
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        self.u.int_in_range(0..=n - 1).unwrap_or(0)
    }

    /// True with probability `num / den`; false once the bytes run out
    /// (where `ratio` would always say true), so short inputs make plain
    /// calls.
    pub fn chance(&mut self, num: u8, den: u8) -> bool {
        !self.u.is_empty() && self.u.ratio(num, den).unwrap_or(false)
    }

    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        self.u.int_in_range(lo..=hi).unwrap_or(lo)
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    pub fn u64(&mut self) -> u64 {
        self.u.arbitrary().unwrap_or(0)
    }
}

/// What one call's tensors share.
struct Plan {
    dtype: u32,
    shape: Vec<i64>,
    /// The length of tensor lists (and of the scalar lists beside them).
    list_len: usize,
    /// The last tensor made: later ones sometimes alias its storage.
    last: Option<rtpu_tensor_ref>,
}

/// The arguments of one call of `op`, borrowing from `arena`.
pub fn draw_args(d: &mut Draw, arena: &mut Arena, op: &OpSchema) -> Vec<rtpu_op_arg> {
    let mut plan = Plan {
        dtype: d.pick(&DTYPES),
        shape: draw_shape(d),
        list_len: d.pick(&[1, 2, 2, 3, 0, 4]),
        last: None,
    };
    op.params
        .iter()
        .map(|p| {
            // The shim always passes a generator (the device's default one
            // when the caller gave none).
            if p.base == Base::Generator {
                let mut a = arg(RTPU_ARG_GENERATOR);
                a.int_list = arena.ints(vec![d.u64() as i64, d.range(0, 1 << 20)]);
                a.list_size = 2;
                return a;
            }
            if d.chance(1, 48) {
                return wrong_kind(d, arena, &mut plan);
            }
            if p.optional && d.chance(1, 4) {
                return arg(RTPU_ARG_NONE);
            }
            draw_arg(d, arena, &mut plan, p)
        })
        .collect()
}

/// A shape of rank 0 to 4 with small dims, sometimes 0.
fn draw_shape(d: &mut Draw) -> Vec<i64> {
    let rank = d.pick(&[0, 1, 1, 2, 2, 2, 3, 3, 4, 4]);
    (0..rank)
        .map(|_| d.pick(&[1, 2, 2, 3, 3, 4, 5, 8, 0, 16]))
        .collect()
}

/// A value of a kind the schema does not ask for.
fn wrong_kind(d: &mut Draw, arena: &mut Arena, plan: &mut Plan) -> rtpu_op_arg {
    match d.below(7) {
        0 => arg(RTPU_ARG_NONE),
        1 => {
            let mut a = arg(RTPU_ARG_INT);
            a.int_value = d.pick(&EDGE_INTS);
            a
        }
        2 => {
            let mut a = arg(RTPU_ARG_DOUBLE);
            a.double_value = d.pick(&EDGE_FLOATS);
            a
        }
        3 => {
            let mut a = arg(RTPU_ARG_STRING);
            a.string_value = arena.string(d.pick(&WORDS));
            a
        }
        4 => {
            let mut a = arg(RTPU_ARG_INT_LIST);
            a.int_list = arena.ints(plan.shape.clone());
            a.list_size = plan.shape.len();
            a
        }
        5 => {
            let mut a = arg(RTPU_ARG_DTYPE);
            a.int_value = d.range(-1, 17);
            a
        }
        _ => {
            let shape = plan.shape.clone();
            let dtype = plan.dtype;
            tensor_arg(make_tensor(d, arena, plan, dtype, shape, Fill::Values))
        }
    }
}

fn draw_arg(d: &mut Draw, arena: &mut Arena, plan: &mut Plan, p: &Param) -> rtpu_op_arg {
    match (p.base, p.list) {
        (Base::Tensor, None) => tensor_arg(draw_tensor(d, arena, plan, p)),
        (Base::Tensor, Some(_)) => {
            let len = if d.chance(1, 16) {
                d.below(6)
            } else {
                plan.list_len
            };
            let items = (0..len)
                .map(|i| {
                    if p.optional_elements && d.chance(1, 3) {
                        tensor_ref_none()
                    } else if p.optional_elements {
                        // `indices` of index/index_put: one index tensor
                        // for dim i.
                        let bound = plan.shape.get(i).copied().unwrap_or(1);
                        index_tensor(d, arena, plan, bound)
                    } else {
                        draw_tensor(d, arena, plan, p)
                    }
                })
                .collect::<Vec<_>>();
            let mut a = arg(RTPU_ARG_TENSOR_LIST);
            a.list_size = items.len();
            a.tensor_list = arena.refs(items);
            a
        }
        (Base::Int, Some(_)) | (Base::Bool, Some(_)) => {
            let values = draw_int_list(d, plan, p);
            let mut a = arg(RTPU_ARG_INT_LIST);
            a.list_size = values.len();
            a.int_list = arena.ints(values);
            a
        }
        (Base::Scalar | Base::Float, Some(_)) => {
            let len = if d.chance(1, 8) {
                d.below(6)
            } else {
                plan.list_len
            };
            let values = (0..len).map(|_| draw_float(d, p)).collect::<Vec<_>>();
            let mut a = arg(RTPU_ARG_DOUBLE_LIST);
            a.list_size = values.len();
            a.double_list = arena.floats(values);
            a
        }
        (Base::Int, None) => {
            let mut a = arg(RTPU_ARG_INT);
            a.int_value = draw_int(d, plan, p);
            a
        }
        (Base::Float, None) => {
            let mut a = arg(RTPU_ARG_DOUBLE);
            a.double_value = draw_float(d, p);
            a
        }
        (Base::Bool, None) => {
            let mut a = arg(RTPU_ARG_BOOL);
            a.bool_value = match p.default.as_deref() {
                Some("True") if d.chance(1, 2) => true,
                Some("False") if d.chance(1, 2) => false,
                _ => d.chance(1, 2),
            };
            a
        }
        (Base::Scalar, None) => match d.below(4) {
            0 => {
                let mut a = arg(RTPU_ARG_INT);
                a.int_value = draw_int(d, plan, p);
                a
            }
            1 if d.chance(1, 4) => {
                let mut a = arg(RTPU_ARG_BOOL);
                a.bool_value = d.chance(1, 2);
                a
            }
            _ => {
                let mut a = arg(RTPU_ARG_DOUBLE);
                a.double_value = draw_float(d, p);
                a
            }
        },
        (Base::Str, _) => {
            let mut a = arg(RTPU_ARG_STRING);
            let word = match p.default_str() {
                Some(default) if d.chance(1, 2) => default.to_string(),
                _ => d.pick(&WORDS).to_string(),
            };
            a.string_value = arena.string(&word);
            a
        }
        (Base::ScalarType, _) => {
            let mut a = arg(RTPU_ARG_DTYPE);
            a.int_value = if d.chance(1, 16) {
                d.range(-1, 200)
            } else {
                d.pick(&DTYPES) as i64
            };
            a
        }
        (Base::Layout | Base::MemoryFormat, _) => {
            let mut a = arg(RTPU_ARG_INT);
            a.int_value = d.range(0, 3);
            a
        }
        (Base::Device, _) => {
            let mut a = arg(RTPU_ARG_DEVICE);
            a.int_value = if d.chance(1, 8) { d.range(-1, 9) } else { 0 };
            a
        }
        (Base::Generator, _) => arg(RTPU_ARG_NONE),
    }
}

fn tensor_arg(t: rtpu_tensor_ref) -> rtpu_op_arg {
    let mut a = arg(RTPU_ARG_TENSOR);
    a.tensor = t;
    a
}

fn tensor_ref_none() -> rtpu_tensor_ref {
    arg(RTPU_ARG_NONE).tensor
}

/// Names of tensors that hold indices.
fn is_index_name(name: &str) -> bool {
    matches!(name, "index" | "indices" | "argmax" | "indices_out")
}

/// Names of per-channel tensors (a 1-D tensor of the channel count).
fn is_channel_name(name: &str) -> bool {
    matches!(
        name,
        "weight"
            | "bias"
            | "running_mean"
            | "running_var"
            | "save_mean"
            | "save_invstd"
            | "save_var"
            | "mean"
            | "invstd"
            | "rstd"
            | "gamma"
            | "beta"
    )
}

/// The channel count of the plan's shape (dim 1, as ATen's NCHW), else
/// its last dim.
fn channels(plan: &Plan) -> i64 {
    match plan.shape.len() {
        0 => 1,
        1 => plan.shape[0],
        _ => plan.shape[1],
    }
}

fn draw_tensor(d: &mut Draw, arena: &mut Arena, plan: &mut Plan, p: &Param) -> rtpu_tensor_ref {
    if is_index_name(&p.name) {
        let bound = plan.shape.last().copied().unwrap_or(1);
        return index_tensor(d, arena, plan, bound);
    }
    if p.name == "target" && d.chance(1, 2) {
        // Class indices (nll_loss, cross entropy).
        return index_tensor(d, arena, plan, channels(plan));
    }
    if p.name == "mask" {
        let shape = plan.shape.clone();
        return make_tensor(d, arena, plan, 1, shape, Fill::Values);
    }
    let dtype = match d.below(16) {
        0 => d.pick(&DTYPES),
        1 if d.chance(1, 8) => d.pick(&[0, 16, 99]),
        _ => plan.dtype,
    };
    let shape = match d.below(20) {
        _ if is_channel_name(&p.name) && d.chance(3, 4) => vec![channels(plan)],
        0..=10 => plan.shape.clone(),
        11 | 12 => broadcastable(d, &plan.shape),
        13 => transposed(&plan.shape),
        14 => Vec::new(),
        15 => {
            // A matrix whose rows match the plan's columns (mm, mv, addmm).
            let cols = plan.shape.last().copied().unwrap_or(1);
            vec![cols, d.pick(&[1, 2, 3, 4])]
        }
        16 => {
            // A huge dim, made as an expanded view; or a negative one.
            let mut shape = plan.shape.clone();
            let i = d.below(shape.len() + 1);
            let huge = d.pick(&[1 << 40, 1 << 62, i64::MAX / 2, i64::MAX, -1, -3]);
            shape.insert(i, huge);
            shape
        }
        _ => draw_shape(d),
    };
    make_tensor(d, arena, plan, dtype, shape, Fill::Values)
}

/// `shape` with some dims set to 1 or leading dims dropped.
fn broadcastable(d: &mut Draw, shape: &[i64]) -> Vec<i64> {
    let drop = d.below(shape.len() + 1);
    shape[drop..]
        .iter()
        .map(|&s| if d.chance(1, 3) { 1 } else { s })
        .collect()
}

/// `shape` with its last two dims swapped (the other operand of a matmul).
fn transposed(shape: &[i64]) -> Vec<i64> {
    let mut out = shape.to_vec();
    let n = out.len();
    if n >= 2 {
        out.swap(n - 1, n - 2);
    }
    out
}

/// An int64 tensor of indices below `bound` (sometimes negative, sometimes
/// out of range), shaped like the plan or as a vector.
fn index_tensor(d: &mut Draw, arena: &mut Arena, plan: &mut Plan, bound: i64) -> rtpu_tensor_ref {
    let dtype = d.pick(&[5, 5, 5, 5, 5, 4, 1, 6, 12]);
    let shape = match d.below(4) {
        0 | 1 => plan.shape.clone(),
        2 => vec![d.pick(&[0, 1, 2, 3, 5])],
        _ => broadcastable(d, &plan.shape),
    };
    let fill = if d.chance(1, 12) {
        Fill::Values
    } else {
        Fill::Indices(bound.max(1))
    };
    make_tensor(d, arena, plan, dtype, shape, fill)
}

/// How a tensor's elements are drawn.
#[derive(Clone, Copy)]
enum Fill {
    /// Small numbers with some extremes (NaN, inf, huge) among them.
    Values,
    /// Indices in `[-bound, bound)`, rarely beyond.
    Indices(i64),
}

/// A storage holding drawn elements and a view of it: mostly dense, else
/// offset, transposed, expanded, aliasing the last tensor's storage, or
/// (rarely) not within its storage at all.
fn make_tensor(
    d: &mut Draw,
    arena: &mut Arena,
    plan: &mut Plan,
    dtype: u32,
    sizes: Vec<i64>,
    fill: Fill,
) -> rtpu_tensor_ref {
    let elem = dtype_size(dtype).unwrap_or(4) as i64;
    let mut strides = contiguous_strides(&sizes);
    let mut offset = 0i64;
    let stored = sizes
        .iter()
        .try_fold(1i64, |acc, &s| acc.checked_mul(s.max(0)));
    let layout = d.below(16);
    if stored.is_none_or(|n| n > MAX_STORED) {
        // Too large to store: expand every dim past 16 from one element.
        for (stride, &size) in strides.iter_mut().zip(&sizes) {
            if size > 16 {
                *stride = 0;
            }
        }
        strides = restride(&sizes, &strides);
    } else {
        match layout {
            0 | 1 => offset = d.range(1, 5),
            2 if sizes.len() >= 2 => {
                // Column-major: a transposed view.
                let mut acc = 1;
                for (stride, &size) in strides.iter_mut().zip(&sizes) {
                    *stride = acc;
                    acc = acc.saturating_mul(size.max(1));
                }
            }
            3 if !sizes.is_empty() => {
                let i = d.below(sizes.len());
                strides[i] = 0;
            }
            4 if sizes.iter().any(|&s| s > 1) => {
                // Every other element.
                strides = strides.iter().map(|s| s.saturating_mul(2)).collect();
            }
            _ => {}
        }
    }
    if d.chance(1, 64) {
        // Outside the ABI's rules: rtpu must refuse it, not read past the
        // storage.
        match d.below(3) {
            0 => offset = d.pick(&[-1, 1 << 40, i64::MAX]),
            1 if !strides.is_empty() => {
                let i = d.below(strides.len());
                strides[i] = d.pick(&[-1, 1 << 40, i64::MAX]);
            }
            _ => strides.push(1),
        }
    }
    let span = sizes
        .iter()
        .zip(&strides)
        .try_fold(0i64, |acc, (&size, &stride)| {
            if size <= 0 {
                return Some(acc);
            }
            acc.checked_add((size - 1).checked_mul(stride)?)
        })
        .unwrap_or(0);
    let needed = if sizes.contains(&0) {
        offset.max(0)
    } else {
        offset.max(0).saturating_add(span).saturating_add(1)
    }
    // A negative stride (drawn on purpose) makes the span negative.
    .clamp(0, MAX_STORED * 4);
    if let Some(last) = &plan.last {
        if layout == 15 && last.dtype == dtype {
            // Alias the last tensor's storage (in-place ops on overlapping
            // arguments).
            let t = finish_view(arena, last.storage, offset, &sizes, &strides, dtype);
            plan.last = Some(copy_ref(&t));
            return t;
        }
    }
    let bytes = fill_bytes(d, dtype, needed as usize, fill);
    let nbytes = (needed * elem) as usize + if d.chance(1, 16) { 3 } else { 0 };
    let Some(storage) = arena.storage(nbytes, &bytes, dtype) else {
        return tensor_ref_none();
    };
    let t = finish_view(arena, storage, offset, &sizes, &strides, dtype);
    plan.last = Some(copy_ref(&t));
    t
}

fn finish_view(
    arena: &mut Arena,
    storage: *const rtpu::storage::rtpu_storage,
    offset: i64,
    sizes: &[i64],
    strides: &[i64],
    dtype: u32,
) -> rtpu_tensor_ref {
    let mut t = arena.view(storage, offset, sizes, strides, dtype);
    // A stride list of another length than the sizes is not expressible
    // in the ABI (one `ndim`); an extra stride above just goes unread.
    t.ndim = sizes.len();
    t
}

fn contiguous_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; sizes.len()];
    let mut acc = 1i64;
    for i in (0..sizes.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(sizes[i].max(1));
    }
    strides
}

/// Row-major strides over the dims whose stride is not 0.
fn restride(sizes: &[i64], strides: &[i64]) -> Vec<i64> {
    let mut out = strides.to_vec();
    let mut acc = 1i64;
    for i in (0..sizes.len()).rev() {
        if strides[i] != 0 {
            out[i] = acc;
            acc = acc.saturating_mul(sizes[i].max(1));
        }
    }
    out
}

/// `count` elements of `dtype` as bytes, from a generator seeded by the
/// fuzz bytes (so large tensors do not eat the input).
fn fill_bytes(d: &mut Draw, dtype: u32, count: usize, fill: Fill) -> Vec<u8> {
    let Some(size) = dtype_size(dtype) else {
        return Vec::new();
    };
    let mut state = d.u64() | 1;
    let special = d.chance(1, 4);
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut out = Vec::with_capacity(count * size);
    for _ in 0..count {
        let r = next();
        let value: f64 = match fill {
            Fill::Indices(bound) => {
                if r % 97 == 0 {
                    EDGE_INTS[(r / 97 % EDGE_INTS.len() as u64) as usize] as f64
                } else {
                    ((r >> 8) % (bound as u64).saturating_mul(2)) as f64 - bound as f64
                }
            }
            Fill::Values if special && r % 7 == 0 => {
                EDGE_FLOATS[(r / 7 % EDGE_FLOATS.len() as u64) as usize]
            }
            Fill::Values => ((r >> 11) % 1601) as f64 / 100.0 - 8.0,
        };
        encode(dtype, value, &mut out);
    }
    out
}

fn encode(dtype: u32, v: f64, out: &mut Vec<u8>) {
    let i = if v.is_finite() { v as i64 } else { 0 };
    match dtype {
        1 => out.push((i != 0) as u8),
        2 => out.push(i as i8 as u8),
        3 => out.extend((i as i16).to_ne_bytes()),
        4 => out.extend((i as i32).to_ne_bytes()),
        5 => out.extend(i.to_ne_bytes()),
        6 => out.push(i as u8),
        7 => out.extend((i as u16).to_ne_bytes()),
        8 => out.extend((i as u32).to_ne_bytes()),
        9 => out.extend((i as u64).to_ne_bytes()),
        10 => out.extend(f16::from_f64(v).to_ne_bytes()),
        11 => out.extend(bf16::from_f64(v).to_ne_bytes()),
        12 => out.extend((v as f32).to_ne_bytes()),
        13 => out.extend(v.to_ne_bytes()),
        14 => {
            out.extend((v as f32).to_ne_bytes());
            out.extend((-v as f32).to_ne_bytes());
        }
        15 => {
            out.extend(v.to_ne_bytes());
            out.extend((v / 2.0).to_ne_bytes());
        }
        _ => {}
    }
}

/// An int for argument `p`: its default, a dim of the plan's rank, or an
/// edge value.
fn draw_int(d: &mut Draw, plan: &Plan, p: &Param) -> i64 {
    if d.chance(1, 24) {
        return d.pick(&EDGE_INTS);
    }
    if let Some(default) = p.default_number() {
        if d.chance(1, 3) {
            return default as i64;
        }
    }
    let rank = plan.shape.len() as i64;
    match p.name.as_str() {
        "dim" | "dim0" | "dim1" | "start_dim" | "end_dim" | "source" | "destination" => {
            d.range(-rank - 1, rank)
        }
        "reduction" => d.range(0, 3),
        "groups" => d.pick(&[1, 1, 1, 2, 3]),
        "ignore_index" => d.pick(&[-100, -100, 0, 1]),
        "k" | "chunks" | "split_size" | "num_classes" | "length" => d.range(0, 5),
        _ => d.range(-3, 8),
    }
}

/// A float for argument `p`: its default, a probability, or an edge value.
fn draw_float(d: &mut Draw, p: &Param) -> f64 {
    if d.chance(1, 12) {
        return d.pick(&EDGE_FLOATS);
    }
    if let Some(default) = p.default_number() {
        if d.chance(1, 3) {
            return default;
        }
    }
    match p.name.as_str() {
        "p" => d.pick(&[0.0, 0.25, 0.5, 1.0]),
        "eps" => 1e-5,
        "momentum" => 0.1,
        _ => d.range(-400, 400) as f64 / 100.0,
    }
}

/// An int list for argument `p`: shapes for `size`, dims for `dim`, small
/// window parameters for pooling and convolution, else its default.
fn draw_int_list(d: &mut Draw, plan: &Plan, p: &Param) -> Vec<i64> {
    let fixed = p.list.flatten();
    if let Some(default) = p.default_ints() {
        if d.chance(1, 3) {
            return default;
        }
    }
    let rank = plan.shape.len();
    let len = match fixed {
        Some(n) if !d.chance(1, 16) => n,
        _ => d.pick(&[rank, rank, 1, 2, 0, 3]),
    };
    let mut values: Vec<i64> = match p.name.as_str() {
        "size" | "shape" | "sizes" | "input_size" | "self_sizes" => match d.below(5) {
            0 | 1 => plan.shape.clone(),
            2 => vec![-1],
            3 => {
                let numel: i64 = plan.shape.iter().product();
                vec![numel]
            }
            _ => draw_shape(d),
        },
        "dim" | "dims" | "perm" => {
            let mut dims: Vec<i64> = (0..rank as i64).collect();
            // A rotation of the dims: a permutation, or a prefix of one.
            if !dims.is_empty() {
                let by = d.below(dims.len());
                dims.rotate_left(by);
            }
            dims.truncate(len.max(1));
            dims.iter()
                .map(|&x| if d.chance(1, 4) { x - rank as i64 } else { x })
                .collect()
        }
        "kernel_size" => (0..len).map(|_| d.pick(&[1, 2, 2, 3])).collect(),
        "stride" => (0..len).map(|_| d.pick(&[1, 1, 2])).collect(),
        "padding" | "output_padding" => (0..len).map(|_| d.pick(&[0, 0, 1])).collect(),
        "dilation" => (0..len).map(|_| d.pick(&[1, 1, 2])).collect(),
        "pad" => (0..len.max(2)).map(|_| d.range(-1, 2)).collect(),
        "output_mask" => (0..len).map(|_| d.range(0, 1)).collect(),
        _ => (0..len).map(|_| d.range(-2, 6)).collect(),
    };
    if d.chance(1, 32) && !values.is_empty() {
        let i = d.below(values.len());
        values[i] = d.pick(&EDGE_INTS);
    }
    values
}
