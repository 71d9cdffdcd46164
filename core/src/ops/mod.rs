//! The op table: ATen schema name → lowering onto a `Builder`, with
//! PyTorch's type promotion and broadcasting.
//!
//! `.out` overloads lower like their functional form and return a new
//! tensor; the PyTorch shim resizes and fills the `out=` tensor from it, so
//! out semantics live in one place.

mod activation;
mod conv;
mod extra;
mod foreach;
pub(crate) mod index;
mod linalg;
mod math;
mod misc;
mod more;
mod nn;
mod norm;
mod pointwise;
mod pool;
mod reduce;
mod resample;

use std::sync::OnceLock;

use crate::builder::{Arg, Builder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::ValueId;

/// One ATen op rtpu runs natively.
pub struct OpDef {
    pub name: &'static str,
    pub lower: fn(&mut Builder) -> Result<()>,
}

/// Every op, in a fixed order (an op's id is its index).
pub fn table() -> &'static [OpDef] {
    static TABLE: OnceLock<Vec<OpDef>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut all = Vec::new();
        all.extend(pointwise::ops());
        all.extend(reduce::ops());
        all.extend(linalg::ops());
        all.extend(nn::ops());
        all.extend(misc::ops());
        all.extend(foreach::ops());
        all.extend(activation::ops());
        all.extend(norm::ops());
        all.extend(conv::ops());
        all.extend(pool::ops());
        all.extend(math::ops());
        all.extend(index::ops());
        all.extend(resample::ops());
        all.extend(extra::ops());
        all.extend(more::ops());
        all
    })
}

/// Shorthand for table entries.
pub(crate) fn op(name: &'static str, lower: fn(&mut Builder) -> Result<()>) -> OpDef {
    OpDef { name, lower }
}

/// Where a lowered result goes: a new tensor, or argument 0 in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    Functional,
    InPlace,
}

// ----- dtype promotion (ATen's c10::promoteTypes and at::result_type) -----

fn category(dtype: DType) -> u8 {
    match dtype {
        DType::Bool => 0,
        DType::I8
        | DType::I16
        | DType::I32
        | DType::I64
        | DType::U8
        | DType::U16
        | DType::U32
        | DType::U64 => 1,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => 2,
        DType::C64 | DType::C128 => 3,
    }
}

pub(crate) fn is_float(dtype: DType) -> bool {
    category(dtype) == 2
}

pub(crate) fn is_integral(dtype: DType, include_bool: bool) -> bool {
    category(dtype) == 1 || (include_bool && dtype == DType::Bool)
}

/// `torch.promote_types`.
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let (ca, cb) = (category(a), category(b));
    if ca != cb {
        let (hi, lo) = if ca > cb { (a, b) } else { (b, a) };
        // A complex wins but widens to hold a double.
        if category(hi) == 3 && lo == F64 {
            return C128;
        }
        return hi;
    }
    match ca {
        1 => {
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
        2 => match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ => {
                if a.size_in_bytes() >= b.size_in_bytes() {
                    a
                } else {
                    b
                }
            }
        },
        3 => C128,
        _ => Bool,
    }
}

/// `c10::canCast`: may a value of `from` be written into a tensor of `to`?
pub(crate) fn can_cast(from: DType, to: DType) -> bool {
    !(category(from) == 3 && category(to) != 3
        || category(from) == 2 && category(to) < 2
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
    Some(if category(h) == 3 {
        h
    } else if category(l) == 3 {
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
pub(crate) fn broadcast_shapes(b: &Builder, shapes: &[Vec<i64>]) -> Result<Vec<i64>> {
    let rank = shapes.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = vec![1i64; rank];
    for shape in shapes {
        let lead = rank - shape.len();
        for (i, &s) in shape.iter().enumerate() {
            let o = &mut out[lead + i];
            if *o == 1 {
                *o = s;
            } else if s != 1 && s != *o {
                return Err(Error::invalid(
                    format!("{}: shapes", b.op_name()),
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
    let shapes: Vec<Vec<i64>> = values.iter().map(|&v| b.dims(v)).collect();
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
