//! Padding: constant_pad_nd, and reflection and replication padding (with
//! backwards) as resampling maps.

use super::resample::{resample, spatial, AxisMap};
use super::{OpDef, Pass};
use crate::builder::{Arg, Builder};
use crate::error::Result;
use crate::ir::Literal;

/// constant_pad_nd(self, pad, value): pairs from the last dim backwards;
/// negative pads crop.
fn constant_pad(b: &mut Builder) -> Result<()> {
    let view = b.tensor_arg(0)?.view.clone();
    let pad = b.int_list_arg(1)?;
    let r = view.sizes.len();
    if pad.len() % 2 != 0 || pad.len() / 2 > r {
        return Err(b.arg_error(
            1,
            format!("an even number of pads, at most {}", 2 * r),
            pad.len(),
        ));
    }
    let value = match b.arg(2) {
        Ok(Arg::Float(v)) => Literal::Float(*v),
        Ok(Arg::Int(v)) => Literal::Int(*v),
        Ok(Arg::Bool(v)) => Literal::Bool(*v),
        _ => Literal::Int(0),
    };
    let (mut low, mut high) = (vec![0i64; r], vec![0i64; r]);
    for (i, chunk) in pad.chunks(2).enumerate() {
        low[r - 1 - i] = chunk[0];
        high[r - 1 - i] = chunk[1];
    }
    for d in 0..r {
        if view.sizes[d] + low[d] + high[d] < 0 {
            return Err(b.arg_error(
                1,
                format!("pads leaving dimension {d} non-negative"),
                format!("{pad:?}"),
            ));
        }
    }
    let x = b.tensor(0)?;
    let y = b.pad(x, value, &low, &high, &vec![0; r]);
    b.output(y)
}

/// Reflection about the edges, which are not repeated.
fn reflect_map(input: i64, low: i64, high: i64) -> AxisMap {
    (0..input + low + high)
        .map(|o| {
            let i = o - low;
            let i = if i < 0 {
                -i
            } else if i >= input {
                2 * (input - 1) - i
            } else {
                i
            };
            vec![(i, 1.0)]
        })
        .collect()
}

/// The edge values repeated.
fn replicate_map(input: i64, low: i64, high: i64) -> AxisMap {
    (0..input + low + high)
        .map(|o| vec![((o - low).clamp(0, input - 1), 1.0)])
        .collect()
}

/// reflection/replication_pad{1,2}d(self, padding) and their backwards
/// (grad_output, self, padding).
fn pad(b: &mut Builder, k: usize, reflect: bool, pass: Pass) -> Result<()> {
    let (sizes, pad_index) = match pass {
        Pass::Forward => (b.tensor_arg(0)?.view.sizes.clone(), 1),
        Pass::Backward => (b.tensor_arg(1)?.view.sizes.clone(), 2),
    };
    let padding = b.int_list_arg(pad_index)?;
    if padding.len() != 2 * k {
        return Err(b.arg_error(pad_index, format!("{} values", 2 * k), padding.len()));
    }
    let input = spatial(b, &sizes, k)?;
    let mut maps = Vec::new();
    for axis in 0..k {
        // Padding pairs run from the last dim backwards.
        let (low, high) = (padding[2 * (k - 1 - axis)], padding[2 * (k - 1 - axis) + 1]);
        if reflect && (low >= input[axis] || high >= input[axis]) {
            return Err(b.arg_error(
                pad_index,
                format!("reflection padding below the input size {}", input[axis]),
                format!("{padding:?}"),
            ));
        }
        maps.push(if reflect {
            reflect_map(input[axis], low, high)
        } else {
            replicate_map(input[axis], low, high)
        });
    }
    resample(b, &maps, &sizes, pass)
}

pub(super) fn ops() -> Vec<OpDef> {
    let mut ops = vec![op!("aten::constant_pad_nd", constant_pad())];
    ops.extend(with_backward!("aten::reflection_pad1d", pad(1, true)));
    ops.extend(with_backward!("aten::reflection_pad2d", pad(2, true)));
    ops.extend(with_backward!("aten::replication_pad1d", pad(1, false)));
    ops.extend(with_backward!("aten::replication_pad2d", pad(2, false)));
    ops
}
