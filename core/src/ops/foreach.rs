//! `_foreach_*` ops, as the optimizers call them: one program updates every
//! tensor of the list.

use super::{can_cast, is_float, is_integral, promote_types, Arith, Form, OpDef};
use crate::builder::{Arg, Builder, TensorArg};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, UnaryOp, ValueId};

/// The second operand of a binary foreach op.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Other {
    /// `Tensor[] other`, one per element.
    List,
    /// One `Scalar` for all elements.
    Scalar,
    /// `Scalar[] scalars`, one per element.
    ScalarList,
    /// One `Tensor other` for all elements.
    Tensor,
}

/// The dtype of `tensor op scalar`: the tensor's, unless the scalar is of a
/// higher category (ATen's wrapped-number rule; floats count as float32).
fn with_scalar(tensor: DType, scalar: &Arg) -> DType {
    match scalar {
        Arg::Float(_) if !is_float(tensor) => DType::F32,
        Arg::Int(_) if tensor == DType::Bool => DType::I64,
        _ => tensor,
    }
}

fn scalar_list(b: &Builder, index: usize, len: usize) -> Result<Vec<Arg>> {
    let list: Vec<Arg> = match b.arg(index)? {
        Arg::FloatList(v) => v.iter().map(|&x| Arg::Float(x)).collect(),
        Arg::IntList(v) => v.iter().map(|&x| Arg::Int(x)).collect(),
        other => return Err(b.arg_error(index, "a Scalar[]", other.kind())),
    };
    if list.len() != len {
        return Err(b.arg_error(index, format!("{len} scalars (one per tensor)"), list.len()));
    }
    Ok(list)
}

fn scalar_value(b: &mut Builder, arg: &Arg, dtype: DType, dims: &[i64]) -> Result<ValueId> {
    let literal = match arg {
        Arg::Float(v) => Literal::Float(*v),
        Arg::Int(v) => Literal::Int(*v),
        Arg::Bool(v) => Literal::Bool(*v),
        other => {
            return Err(Error::invalid(
                format!("{}: scalar", b.op_name()),
                "a Scalar",
                other.kind(),
            ))
        }
    };
    let v = b.scalar_input(literal, dtype);
    b.broadcast_to(v, dims)
}

fn check_lengths(b: &Builder, index: usize, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(b.arg_error(index, format!("{expected} tensors (as many as self)"), got));
    }
    Ok(())
}

/// Stores element `i`'s result: in place into `self[i]`, or as output `i`.
fn store(b: &mut Builder, form: Form, target: &TensorArg, value: ValueId) -> Result<()> {
    if form == Form::InPlace {
        let have = b.dtype(value);
        if !can_cast(have, target.view.dtype) {
            return Err(Error::invalid(
                format!("{}: result type {have}", b.op_name()),
                format!("a type castable to {}", target.view.dtype),
                have,
            ));
        }
        b.write(target, value)
    } else {
        b.output(value)
    }
}

/// `self[i] op (alpha * other[i])` over the list.
fn binary(b: &mut Builder, op: BinaryOp, other: Other, form: Form) -> Result<()> {
    let selfs: Vec<TensorArg> = b.tensor_list_arg(0)?.into_iter().cloned().collect();
    let others: Vec<Arg> = match other {
        Other::List => {
            let list = b.tensor_list_arg(1)?;
            check_lengths(b, 1, selfs.len(), list.len())?;
            list.into_iter().map(|t| Arg::Tensor(t.clone())).collect()
        }
        Other::Scalar => vec![b.arg(1)?.clone(); selfs.len()],
        Other::ScalarList => scalar_list(b, 1, selfs.len())?,
        Other::Tensor => vec![Arg::Tensor(b.tensor_arg(1)?.clone()); selfs.len()],
    };
    let alpha = match b.arg(2) {
        Ok(Arg::Int(1)) | Ok(Arg::None) | Err(_) => None,
        Ok(a) => Some(a.clone()),
    };
    for (target, other) in selfs.iter().zip(&others) {
        let dtype = match other {
            Arg::Tensor(t) => promote_types(target.view.dtype, t.view.dtype),
            scalar => with_scalar(target.view.dtype, scalar),
        };
        let x = b.read(target)?;
        let x = b.convert(x, dtype);
        let dims = b.dims(x);
        let mut y = match other {
            Arg::Tensor(t) => {
                let y = b.read(t)?;
                let y = b.convert(y, dtype);
                b.broadcast_to(y, &dims)?
            }
            scalar => scalar_value(b, scalar, dtype, &dims)?,
        };
        if let Some(alpha) = &alpha {
            let a = scalar_value(b, alpha, dtype, &dims)?;
            y = b.binary(BinaryOp::Mul, y, a)?;
        }
        // maximum propagates NaN, as torch._foreach_maximum does.
        let out = if op == BinaryOp::Max {
            b.maximum(x, y)?
        } else {
            b.binary(op, x, y)?
        };
        store(b, form, target, out)?;
    }
    Ok(())
}

/// `self[i] + value_i * t1[i] (* or /) t2[i]`.
fn addc(b: &mut Builder, divide: bool, scalars: Other) -> Result<()> {
    let selfs: Vec<TensorArg> = b.tensor_list_arg(0)?.into_iter().cloned().collect();
    let t1: Vec<TensorArg> = b.tensor_list_arg(1)?.into_iter().cloned().collect();
    let t2: Vec<TensorArg> = b.tensor_list_arg(2)?.into_iter().cloned().collect();
    check_lengths(b, 1, selfs.len(), t1.len())?;
    check_lengths(b, 2, selfs.len(), t2.len())?;
    let values: Vec<Arg> = match scalars {
        Other::ScalarList => scalar_list(b, 3, selfs.len())?,
        _ => vec![b.arg(3).cloned().unwrap_or(Arg::Int(1)); selfs.len()],
    };
    for i in 0..selfs.len() {
        let dtype = promote_types(
            promote_types(selfs[i].view.dtype, t1[i].view.dtype),
            t2[i].view.dtype,
        );
        if divide && is_integral(dtype, true) {
            return Err(Error::invalid(
                format!("{}: operands", b.op_name()),
                "floating-point tensors",
                dtype,
            ));
        }
        let x = b.read(&selfs[i])?;
        let x = b.convert(x, dtype);
        let dims = b.dims(x);
        let p = b.read(&t1[i])?;
        let p = b.convert(p, dtype);
        let p = b.broadcast_to(p, &dims)?;
        let q = b.read(&t2[i])?;
        let q = b.convert(q, dtype);
        let q = b.broadcast_to(q, &dims)?;
        let pq = b.binary(if divide { BinaryOp::Div } else { BinaryOp::Mul }, p, q)?;
        let v = scalar_value(b, &values[i], dtype, &dims)?;
        let scaled = b.binary(BinaryOp::Mul, pq, v)?;
        let out = b.binary(BinaryOp::Add, x, scaled)?;
        store(b, Form::InPlace, &selfs[i], out)?;
    }
    Ok(())
}

/// `self[i] + weight * (end[i] - self[i])`.
fn lerp(b: &mut Builder) -> Result<()> {
    let selfs: Vec<TensorArg> = b.tensor_list_arg(0)?.into_iter().cloned().collect();
    let ends: Vec<TensorArg> = b.tensor_list_arg(1)?.into_iter().cloned().collect();
    check_lengths(b, 1, selfs.len(), ends.len())?;
    let weight = b.arg(2)?.clone();
    for (target, end) in selfs.iter().zip(&ends) {
        let dtype = target.view.dtype;
        let x = b.read(target)?;
        let dims = b.dims(x);
        let e = b.read(end)?;
        let e = b.convert(e, dtype);
        let e = b.broadcast_to(e, &dims)?;
        let w = scalar_value(b, &weight, dtype, &dims)?;
        let d = b.binary(BinaryOp::Sub, e, x)?;
        let s = b.binary(BinaryOp::Mul, w, d)?;
        let out = b.binary(BinaryOp::Add, x, s)?;
        store(b, Form::InPlace, target, out)?;
    }
    Ok(())
}

fn unary(b: &mut Builder, op: UnaryOp, form: Form) -> Result<()> {
    let selfs: Vec<TensorArg> = b.tensor_list_arg(0)?.into_iter().cloned().collect();
    for target in &selfs {
        let x = b.read(target)?;
        let dtype = if is_float(target.view.dtype) || op == UnaryOp::Neg {
            target.view.dtype
        } else {
            DType::F32
        };
        let x = b.convert(x, dtype);
        let out = b.unary(op, x);
        store(b, form, target, out)?;
    }
    Ok(())
}

fn zero(b: &mut Builder) -> Result<()> {
    let selfs: Vec<TensorArg> = b.tensor_list_arg(0)?.into_iter().cloned().collect();
    for target in &selfs {
        let z = b.constant(Literal::Int(0), target.view.dtype, &[]);
        b.write(target, z)?;
    }
    Ok(())
}

/// `self[i] = src[i]` (with conversion).
fn copy(b: &mut Builder) -> Result<()> {
    let selfs: Vec<TensorArg> = b.tensor_list_arg(0)?.into_iter().cloned().collect();
    let srcs: Vec<TensorArg> = b.tensor_list_arg(1)?.into_iter().cloned().collect();
    check_lengths(b, 1, selfs.len(), srcs.len())?;
    for (target, src) in selfs.iter().zip(&srcs) {
        let v = b.read(src)?;
        b.write(target, v)?;
    }
    Ok(())
}

/// `_foreach_<name>_.<other>` (in place) and `_foreach_<name>.<other>` for
/// each kind of second operand.
macro_rules! binary_family {
    ($name:literal, $op:expr, [$($other:ident),+]) => {
        [$(
            op!(
                concat!("aten::_foreach_", $name, "_.", stringify!($other)),
                binary($op, Other::$other, Form::InPlace)
            ),
            op!(
                concat!("aten::_foreach_", $name, ".", stringify!($other)),
                binary($op, Other::$other, Form::Functional)
            ),
        )+]
    };
}

pub(super) fn ops() -> Vec<OpDef> {
    use Other::{Scalar, ScalarList};
    let mut ops = vec![
        op!("aten::_foreach_addcmul_.Scalar", addc(false, Scalar)),
        op!(
            "aten::_foreach_addcmul_.ScalarList",
            addc(false, ScalarList)
        ),
        op!("aten::_foreach_addcdiv_.Scalar", addc(true, Scalar)),
        op!("aten::_foreach_addcdiv_.ScalarList", addc(true, ScalarList)),
        op!("aten::_foreach_lerp_.Scalar", lerp()),
        op!(
            "aten::_foreach_sqrt",
            unary(UnaryOp::Sqrt, Form::Functional)
        ),
        op!("aten::_foreach_sqrt_", unary(UnaryOp::Sqrt, Form::InPlace)),
        op!("aten::_foreach_neg", unary(UnaryOp::Neg, Form::Functional)),
        op!("aten::_foreach_neg_", unary(UnaryOp::Neg, Form::InPlace)),
        op!("aten::_foreach_zero_", zero()),
        op!("aten::_foreach_copy_", copy()),
    ];
    ops.extend(binary_family!(
        "add",
        BinaryOp::Add,
        [List, Scalar, ScalarList, Tensor]
    ));
    ops.extend(binary_family!(
        "mul",
        BinaryOp::Mul,
        [List, Scalar, ScalarList, Tensor]
    ));
    ops.extend(binary_family!(
        "div",
        BinaryOp::Div,
        [List, Scalar, ScalarList, Tensor]
    ));
    // ATen defines the one-tensor (.Tensor) overload only for add, mul and div.
    ops.extend(binary_family!(
        "sub",
        BinaryOp::Sub,
        [List, Scalar, ScalarList]
    ));
    ops.extend(binary_family!(
        "maximum",
        BinaryOp::Max,
        [List, Scalar, ScalarList]
    ));
    ops
}
