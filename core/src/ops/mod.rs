//! The op table: ATen schema name → lowering onto a `Builder`, with
//! PyTorch's type promotion and broadcasting.
//!
//! One file per op family. Each family's `ops()` lists its table entries
//! declaratively (with the macros in `entries`): an entry names the schema
//! and calls the family lowering with a typed kind (`Unary::Sin`,
//! `ReduceOp::Max`, ...) and, for ops with an in-place or backward variant,
//! its `Form` or `Pass`, so no lowering reads its own op name to decide
//! what to compute.
//!
//! `.out` overloads lower like their functional form and return a new
//! tensor; the PyTorch shim resizes and fills the `out=` tensor from it, so
//! out semantics live in one place.

#[macro_use]
mod entries;

mod activation;
mod binary;
mod compare;
mod complex;
mod conv;
mod factory;
mod foreach;
pub(crate) mod index;
mod linalg;
mod loss;
mod normalization;
mod optim;
mod padding;
mod pool;
mod random;
mod reduce;
mod resample;
mod scatter;
mod shape;
mod softmax;
mod sort;
mod unary;

use std::sync::OnceLock;

use crate::builder::{Arg, Builder};
use crate::dims::Dims;
use crate::dtype::{Category, DType};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareDir, Literal, ReduceOp, ValueId};

/// One ATen op rtpu runs natively.
pub struct OpDef {
    pub name: &'static str,
    pub lower: fn(&mut Builder) -> Result<()>,
}

/// Every op, in a fixed order (an op's id is its index).
pub fn table() -> &'static [OpDef] {
    static TABLE: OnceLock<Vec<OpDef>> = OnceLock::new();
    TABLE.get_or_init(|| {
        [
            unary::ops,
            binary::ops,
            compare::ops,
            activation::ops,
            softmax::ops,
            loss::ops,
            reduce::ops,
            sort::ops,
            linalg::ops,
            index::ops,
            scatter::ops,
            shape::ops,
            factory::ops,
            random::ops,
            normalization::ops,
            padding::ops,
            conv::ops,
            pool::ops,
            resample::ops,
            foreach::ops,
            optim::ops,
            complex::ops,
        ]
        .into_iter()
        .flat_map(|family| family())
        .collect()
    })
}

/// Which pass a lowering shared by an op and its backward computes; the
/// backward's arguments start with the gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    Backward,
}

impl Pass {
    /// Where the forward's arguments start: after the backward's gradient.
    pub(crate) fn first_arg(self) -> usize {
        match self {
            Pass::Forward => 0,
            Pass::Backward => 1,
        }
    }
}

/// Where a lowered result goes: a new tensor, or argument 0 in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    Functional,
    InPlace,
}

// ----- dtype promotion (ATen's c10::promoteTypes and at::result_type) -----

pub(crate) fn is_float(dtype: DType) -> bool {
    dtype.category() == Category::Float
}

pub(crate) fn is_integral(dtype: DType, include_bool: bool) -> bool {
    dtype.category() == Category::Integer || (include_bool && dtype == DType::Bool)
}

/// `torch.promote_types`.
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let (ca, cb) = (a.category(), b.category());
    if ca != cb {
        let (hi, lo) = if ca > cb { (a, b) } else { (b, a) };
        // A complex wins but widens to hold a double.
        if hi.category() == Category::Complex && lo == F64 {
            return C128;
        }
        return hi;
    }
    match ca {
        Category::Integer => {
            let signed = |d: DType| matches!(d, I8 | I16 | I32 | I64);
            let bits = |d: DType| d.size_in_bytes();
            match (signed(a), signed(b)) {
                (true, true) | (false, false) => {
                    if bits(a) >= bits(b) {
                        a
                    } else {
                        b
                    }
                }
                _ => {
                    let (s, u) = if signed(a) { (a, b) } else { (b, a) };
                    // uint8 with a signed type: the smallest signed type
                    // holding both; wider unsigned types follow ATen's table.
                    match (s, u) {
                        (I8, U8) => I16,
                        (s, U8) => s,
                        (I8 | I16, U16) => I32,
                        (I32 | I64, U16) => s,
                        (I8 | I16 | I32, U32) => I64,
                        (I64, U32) => I64,
                        _ => I64,
                    }
                }
            }
        }
        Category::Float => match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ => {
                if a.size_in_bytes() >= b.size_in_bytes() {
                    a
                } else {
                    b
                }
            }
        },
        Category::Complex => C128,
        Category::Bool => Bool,
    }
}

/// `c10::canCast`: may a value of `from` be written into a tensor of `to`?
pub(crate) fn can_cast(from: DType, to: DType) -> bool {
    !(from.category() == Category::Complex && to.category() != Category::Complex
        || from.category() == Category::Float && to.category() < Category::Float
        || from != DType::Bool && to == DType::Bool)
}

/// `at::result_type` over arguments: tensors of rank > 0 first, then 0-d
/// tensors, then Python numbers (whose floats count as float32, the
/// default dtype), combined by category as ATen does.
pub(crate) fn result_type(b: &Builder, indices: &[usize]) -> Result<DType> {
    let mut dimensioned: Option<DType> = None;
    let mut zero_dim: Option<DType> = None;
    let mut wrapped: Option<DType> = None;
    let join =
        |slot: &mut Option<DType>, d: DType| *slot = Some(slot.map_or(d, |s| promote_types(s, d)));
    for &i in indices {
        match b.arg(i)? {
            Arg::Tensor(t) if !t.view.sizes.is_empty() => join(&mut dimensioned, t.view.dtype),
            Arg::Tensor(t) => join(&mut zero_dim, t.view.dtype),
            Arg::Float(_) => join(&mut wrapped, DType::F32),
            Arg::Int(_) => join(&mut wrapped, DType::I64),
            Arg::Bool(_) => join(&mut wrapped, DType::Bool),
            Arg::None => {}
            other => return Err(b.arg_error(i, "a Tensor or Scalar", other.kind())),
        }
    }
    let combined = combine_categories(zero_dim, wrapped);
    combine_categories(dimensioned, combined).ok_or_else(|| {
        Error::invalid(
            format!("{}: operands", b.op_name()),
            "at least one tensor or scalar",
            "none",
        )
    })
}

/// ATen's `combine_categories`: a lower-priority group only matters when it
/// is of a higher category.
fn combine_categories(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let (h, l) = match (higher, lower) {
        (None, l) => return l,
        (h, None) => return h,
        (Some(h), Some(l)) => (h, l),
    };
    Some(if h.category() == Category::Complex {
        h
    } else if l.category() == Category::Complex {
        if is_float(h) {
            if h == DType::F64 {
                DType::C128
            } else {
                DType::C64
            }
        } else {
            l
        }
    } else if is_float(h) {
        h
    } else if h == DType::Bool || is_float(l) {
        promote_types(h, l)
    } else {
        h
    })
}

/// Reads tensor-or-scalar argument `index` as a value of `dtype`.
pub(crate) fn operand(b: &mut Builder, index: usize, dtype: DType) -> Result<ValueId> {
    if b.is_scalar(index) {
        return b.scalar_arg(index, dtype);
    }
    let v = b.tensor(index)?;
    Ok(b.convert(v, dtype))
}

/// The broadcast shape of several shapes (NumPy rules), or a clear error.
pub(crate) fn broadcast_shapes(
    b: &Builder,
    shapes: &[impl AsRef<[i64]> + std::fmt::Debug],
) -> Result<Dims> {
    broadcast_shapes_of(b, "shapes", shapes)
}

/// `broadcast_shapes`, naming the shapes `what` in its error.
pub(crate) fn broadcast_shapes_of(
    b: &Builder,
    what: &str,
    shapes: &[impl AsRef<[i64]> + std::fmt::Debug],
) -> Result<Dims> {
    let rank = shapes.iter().map(|s| s.as_ref().len()).max().unwrap_or(0);
    let mut out = Dims::filled(1, rank);
    for shape in shapes {
        let shape = shape.as_ref();
        let lead = rank - shape.len();
        for (i, &s) in shape.iter().enumerate() {
            let o = &mut out[lead + i];
            if *o == 1 {
                *o = s;
            } else if s != 1 && s != *o {
                return Err(Error::invalid(
                    format!("{}: {what}", b.op_name()),
                    "shapes that broadcast together",
                    format!("{shapes:?} (size {s} against {o} at dim {})", lead + i),
                ));
            }
        }
    }
    Ok(out)
}

/// Broadcasts values to their common shape.
pub(crate) fn broadcast_all(b: &mut Builder, values: &[ValueId]) -> Result<Vec<ValueId>> {
    let shapes: Vec<&[i64]> = values.iter().map(|&v| &b.ty(v).dims[..]).collect();
    let target = broadcast_shapes(b, &shapes)?;
    values.iter().map(|&v| b.broadcast_to(v, &target)).collect()
}

/// Stores `value` per `form`: a new tensor, or into argument 0 (whose dtype
/// must be able to hold the result, as ATen checks).
pub(crate) fn finish(b: &mut Builder, form: Form, value: ValueId) -> Result<()> {
    match form {
        Form::Functional => b.output(value),
        Form::InPlace => {
            let target = b.tensor_arg(0)?.view.clone();
            let have = b.dtype(value);
            if !can_cast(have, target.dtype) {
                return Err(Error::invalid(
                    format!("{}: result type {have}", b.op_name()),
                    format!("a type castable to the output's {}", target.dtype),
                    have,
                ));
            }
            let dims = b.dims(value);
            if broadcast_shapes(b, &[dims.clone(), target.sizes.clone()])? != target.sizes {
                return Err(Error::invalid(
                    format!("{}: in-place result", b.op_name()),
                    format!("a shape broadcastable to {:?}", target.sizes),
                    format!("{dims:?}"),
                ));
            }
            b.write_arg(0, value)
        }
    }
}

/// Normalises a possibly negative dim against `rank`.
pub(crate) fn wrap_dim(b: &Builder, dim: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::invalid(
            format!("{}: dimension", b.op_name()),
            format!("in range [{}, {}]", -r, r - 1),
            dim,
        ));
    }
    Ok(d as usize)
}

/// Arguments `indices.0` and `indices.1` (tensors or scalars) as `dtype`,
/// broadcast together.
pub(crate) fn operand_pair(
    b: &mut Builder,
    indices: (usize, usize),
    dtype: DType,
) -> Result<(ValueId, ValueId)> {
    let x = operand(b, indices.0, dtype)?;
    let y = operand(b, indices.1, dtype)?;
    let [x, y] = broadcast_all(b, &[x, y])?[..] else {
        unreachable!("two values in, two out")
    };
    Ok((x, y))
}

/// Arguments 0 and 1 promoted (integers to float32 when `float`) and
/// broadcast, converted to float32 for 16-bit inputs; and the result dtype.
pub(crate) fn binary_operands(b: &mut Builder, float: bool) -> Result<(ValueId, ValueId, DType)> {
    let promoted = result_type(b, &[0, 1])?;
    if float {
        real_only(b, promoted)?;
    }
    let dtype = if float && !is_float(promoted) {
        DType::F32
    } else {
        promoted
    };
    let (x, y) = operand_pair(b, (0, 1), dtype)?;
    let acc = accumulate_dtype(dtype);
    Ok((b.convert(x, acc), b.convert(y, acc), dtype))
}

/// The dtype sums and 16-bit float math accumulate in: float32 for 16-bit
/// floats, as ATen's CPU kernels do.
pub(crate) fn accumulate_dtype(dtype: DType) -> DType {
    if matches!(dtype, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dtype
    }
}

/// The float type random draws and float ranges compute in: float64 for
/// float64, float32 otherwise.
pub(crate) fn wide_float(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Errors unless `dtype` (of the op's `what`) is a floating point type; a
/// complex one is a call the shim runs on the CPU instead.
pub(crate) fn require_float(b: &Builder, what: &str, dtype: DType) -> Result<()> {
    real_only(b, dtype)?;
    ensure(b, is_float(dtype), what, "a floating point tensor", dtype)
}

/// Refuses a complex `dtype` for an op whose lowering is a real-only
/// formula, as a call not lowered (the shim then runs it on the CPU).
pub(crate) fn real_only(b: &Builder, dtype: DType) -> Result<()> {
    if dtype.category() == Category::Complex {
        return Err(Error::NotLowered {
            op: b.op_name().to_string(),
            what: format!("{dtype} tensors"),
        });
    }
    Ok(())
}

/// Errors unless `ok`, naming the op's `what` and what was `expected`.
pub(crate) fn ensure(
    b: &Builder,
    ok: bool,
    what: &str,
    expected: impl std::fmt::Display,
    got: impl std::fmt::Display,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("{}: {what}", b.op_name()),
            expected,
            got,
        ))
    }
}

/// Float tensor argument `index`: its value, dtype and sizes.
pub(crate) fn float_input(b: &mut Builder, index: usize) -> Result<(ValueId, DType, Dims)> {
    let view = b.tensor_arg(index)?.view.clone();
    require_float(b, "input", view.dtype)?;
    let x = b.tensor(index)?;
    Ok((x, view.dtype, view.sizes))
}

/// Sizes with a 0-d tensor counted as 1-D, as ATen's dim-wise ops do.
pub(crate) fn at_least_1d(sizes: &[i64]) -> Vec<i64> {
    if sizes.is_empty() {
        vec![1]
    } else {
        sizes.to_vec()
    }
}

/// `sizes` with the `reduced` dims kept as size 1 (keepdim).
pub(crate) fn keepdim_shape(sizes: &[i64], reduced: &[i64]) -> Vec<i64> {
    sizes
        .iter()
        .enumerate()
        .map(|(d, &s)| if reduced.contains(&(d as i64)) { 1 } else { s })
        .collect()
}

/// `value`, reduced over `reduced` dims of `sizes`, reshaped to keep them
/// as size 1 when `keepdim`.
pub(crate) fn keep_dims(
    b: &mut Builder,
    value: ValueId,
    sizes: &[i64],
    reduced: &[i64],
    keepdim: bool,
) -> Result<ValueId> {
    if keepdim {
        b.reshape(value, &keepdim_shape(sizes, reduced))
    } else {
        Ok(value)
    }
}

/// The sizes after reducing dim `d` of `sizes`: kept as 1 with keepdim,
/// dropped otherwise.
pub(crate) fn reduced_shape(sizes: &[i64], d: usize, keepdim: bool) -> Vec<i64> {
    if keepdim {
        keepdim_shape(sizes, &[d as i64])
    } else {
        sizes
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != d)
            .map(|(_, &s)| s)
            .collect()
    }
}

/// The reduced dims from an optional dim list (None or [] = all dims).
pub(crate) fn reduce_dims(b: &Builder, index: usize, rank: usize) -> Result<Vec<i64>> {
    let dims = match b.arg(index).ok() {
        None | Some(Arg::None) => None,
        Some(_) => Some(b.int_list_arg(index)?),
    };
    match dims {
        Some(d) if !d.is_empty() => {
            let mut out = wrap_dims(b, &d, rank)?;
            out.sort();
            out.dedup();
            // A 0-d tensor accepts dim 0 or -1 and has nothing to reduce.
            if rank == 0 {
                out.clear();
            }
            Ok(out)
        }
        _ => Ok((0..rank as i64).collect()),
    }
}

/// Every dim of a tensor of rank `rank`.
pub(crate) fn all_dims(rank: usize) -> Vec<i64> {
    (0..rank as i64).collect()
}

/// `dims`, each normalised against `rank`.
pub(crate) fn wrap_dims(b: &Builder, dims: &[i64], rank: usize) -> Result<Vec<i64>> {
    dims.iter()
        .map(|&d| wrap_dim(b, d, rank).map(|v| v as i64))
        .collect()
}

/// `x` reduced by `op` over `dims` (of `sizes`), kept as size 1 when
/// `keepdim`.
pub(crate) fn reduced(
    b: &mut Builder,
    x: ValueId,
    op: ReduceOp,
    dims: &[i64],
    keepdim: bool,
    sizes: &[i64],
) -> Result<ValueId> {
    let out = b.reduce(x, op, dims);
    keep_dims(b, out, sizes, dims, keepdim)
}

/// `x` reduced by `op` (Max or Min) over `dims` with torch's NaN rule: a
/// reduced slice that holds a NaN gives NaN. XLA's CPU reductions skip NaN,
/// so the NaNs are counted apart and selected in.
pub(crate) fn reduce_extreme(
    b: &mut Builder,
    x: ValueId,
    op: ReduceOp,
    dims: &[i64],
) -> Result<ValueId> {
    let out = b.reduce(x, op, dims);
    if dims.is_empty() || !is_float(b.dtype(x)) {
        return Ok(out);
    }
    let nan = b.is_nan(x)?;
    let any_nan = b.reduce(nan, ReduceOp::Or, dims);
    let nan_value = b.float_like(f64::NAN, out);
    b.select(any_nan, nan_value, out)
}

/// Scalar argument `index` as `dtype`, broadcast to `dims`.
pub(crate) fn broadcast_scalar(
    b: &mut Builder,
    index: usize,
    dtype: DType,
    dims: &[i64],
) -> Result<ValueId> {
    let v = b.scalar_arg(index, dtype)?;
    b.broadcast_to(v, dims)
}

/// Errors when the dim an op picks from (of `size`) is empty.
pub(crate) fn require_nonempty_dim(b: &Builder, size: i64, sizes: &[i64]) -> Result<()> {
    let sizes = format!("sizes {sizes:?}");
    ensure(b, size != 0, "input", "a non-empty dimension", sizes)
}

/// Outputs `values` in order, each reshaped to `shape`.
pub(crate) fn output_as(b: &mut Builder, shape: &[i64], values: &[ValueId]) -> Result<()> {
    for &v in values {
        let v = b.reshape(v, shape)?;
        b.output(v)?;
    }
    Ok(())
}

/// Outputs `value(b)` when `wanted` (a backward's output_mask entry), an
/// undefined tensor otherwise.
pub(crate) fn output_if(
    b: &mut Builder,
    wanted: bool,
    value: impl FnOnce(&mut Builder) -> Result<ValueId>,
) -> Result<()> {
    if wanted {
        let v = value(b)?;
        b.output(v)
    } else {
        b.none_output();
        Ok(())
    }
}

/// Elementwise arithmetic on same-shaped values, for lowerings that read
/// as formulas.
pub(crate) trait Arith {
    fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId>;
    fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId>;
    fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId>;
    fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId>;
    /// `x != x`.
    fn is_nan(&mut self, x: ValueId) -> Result<ValueId>;
    /// torch.maximum: the larger operand, NaN where either is NaN.
    fn maximum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId>;
    /// torch.minimum: the smaller operand, NaN where either is NaN.
    fn minimum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId>;
    /// The float constant `v` in the dtype and shape of `like`.
    fn float_like(&mut self, v: f64, like: ValueId) -> ValueId;
}

impl Arith for Builder<'_> {
    fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Add, x, y)
    }
    fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Sub, x, y)
    }
    fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, x, y)
    }
    fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Div, x, y)
    }
    fn is_nan(&mut self, x: ValueId) -> Result<ValueId> {
        self.compare(CompareDir::Ne, x, x)
    }
    fn maximum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        nan_propagating(self, BinaryOp::Max, x, y)
    }
    fn minimum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        nan_propagating(self, BinaryOp::Min, x, y)
    }
    fn float_like(&mut self, v: f64, like: ValueId) -> ValueId {
        let (dtype, dims) = (self.dtype(like), self.dims(like));
        self.constant(Literal::Float(v), dtype, &dims)
    }
}

/// `op` (Max or Min) of `x` and `y`, NaN where either is NaN, as torch's
/// max/min are everywhere. XLA's CPU max/min return one of the operands
/// when one is NaN (which, depends on the order), so float NaNs are
/// selected in explicitly; XLA folds the test away for constant operands.
fn nan_propagating(b: &mut Builder, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
    let out = b.binary(op, x, y)?;
    if !is_float(b.dtype(out)) {
        return Ok(out);
    }
    let x_nan = b.is_nan(x)?;
    let out = b.select(x_nan, x, out)?;
    let y_nan = b.is_nan(y)?;
    b.select(y_nan, y, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn op_names_are_unique() {
        let mut names: Vec<&str> = table().iter().map(|op| op.name).collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "an op is registered twice");
    }

    #[test]
    fn promotion_matches_torch() {
        assert_eq!(promote_types(I64, F32), F32);
        assert_eq!(promote_types(U8, I8), I16);
        assert_eq!(promote_types(Bool, I32), I32);
        assert_eq!(promote_types(F16, BF16), F32);
        assert_eq!(promote_types(F32, F64), F64);
        assert_eq!(promote_types(C64, F64), C128);
        assert!(can_cast(I64, F32));
        assert!(!can_cast(F32, I64));
        assert!(!can_cast(I64, Bool));
    }
}
