//! Complex numbers: conjugation, building a complex tensor from its parts
//! (`torch.complex`, `torch.polar`). Reading the parts (`.real`, `.imag`,
//! `view_as_real`) needs no op: those are float views of the complex
//! storage, which the builder reads and writes (`Builder::flat_as`).

use super::{finish, operand_pair, Arith, Form, OpDef};
use crate::builder::Builder;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::UnaryOp;

/// conj_physical: the conjugate as a new tensor (a real one unchanged).
fn conj_physical(b: &mut Builder, form: Form) -> Result<()> {
    let x = b.tensor(0)?;
    let out = b.conj(x)?;
    finish(b, form, out)
}

/// complex(real, imag) (`polar`: polar(abs, angle)) from two float32 or
/// float64 tensors of one dtype, broadcast together.
fn from_parts(b: &mut Builder, polar: bool) -> Result<()> {
    let dtypes = [b.tensor_arg(0)?.view.dtype, b.tensor_arg(1)?.view.dtype];
    if dtypes[0] != dtypes[1] || !matches!(dtypes[0], DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::invalid(
            format!("{}: operands", b.op_name()),
            "two float tensors of one dtype",
            format!("{} and {}", dtypes[0], dtypes[1]),
        ));
    }
    // complex32 (from float16) has no XLA type: the CPU builds it.
    if dtypes[0] == DType::F16 {
        return Err(Error::NotLowered {
            op: b.op_name().to_string(),
            what: "float16 parts (complex32)".to_string(),
        });
    }
    let (x, y) = operand_pair(b, (0, 1), dtypes[0])?;
    let (re, im) = if polar {
        let c = b.unary(UnaryOp::Cos, y);
        let s = b.unary(UnaryOp::Sin, y);
        (b.mul(x, c)?, b.mul(x, s)?)
    } else {
        (x, y)
    };
    let out = b.complex(re, im)?;
    b.output(out)
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = Vec::new();
    // The functional conj_physical decomposes into these (it is
    // CompositeImplicitAutograd).
    ops.push(op!(
        "aten::conj_physical.out",
        conj_physical(Form::Functional)
    ));
    ops.push(op!("aten::conj_physical_", conj_physical(Form::InPlace)));
    ops.extend(with_out!("aten::complex", from_parts(false)));
    ops.extend(with_out!("aten::polar", from_parts(true)));
    ops
}
