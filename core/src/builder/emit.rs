//! Graph construction: typed helpers that add IR nodes, checking shapes and
//! dtypes so a mismatch is an error, not a bad program.

use super::{Arg, Builder, ParamSource};
use crate::dims::Dims;
use crate::dtype::{Category, DType};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, ConvWindow, Literal, Node, TensorType, UnaryOp, ValueId};

impl<'a> Builder<'a> {
    // ----- graph construction -------------------------------------------

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.graph.ty(v)
    }

    pub fn dims(&self, v: ValueId) -> Dims {
        self.graph.ty(v).dims.clone()
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.graph.ty(v).dtype
    }

    pub(super) fn push(&mut self, node: Node, ty: TensorType) -> ValueId {
        self.graph.nodes.push((node, ty));
        self.graph.nodes.len() - 1
    }

    pub(super) fn param(&mut self, ty: TensorType, source: ParamSource) -> ValueId {
        let index = self.graph.params.len();
        self.graph.params.push(ty.clone());
        self.sources.push(source);
        self.push(Node::Param(index), ty)
    }

    /// A structural constant (identities, offsets): baked into the program.
    pub fn constant(&mut self, literal: Literal, dtype: DType, dims: &[i64]) -> ValueId {
        self.push(Node::Constant(literal), TensorType::new(dtype, dims))
    }

    /// A scalar argument as a 0-d device input of `dtype`: its value does not
    /// enter the program text, so new values do not recompile.
    /// Host data (e.g. indices computed on the host) as a device input.
    pub fn host_tensor(&mut self, bytes: Vec<u8>, dtype: DType, dims: &[i64]) -> ValueId {
        self.param(
            TensorType::new(dtype, dims),
            ParamSource::Host {
                bytes,
                dtype,
                dims: dims.to_vec(),
            },
        )
    }

    pub fn scalar_input(&mut self, literal: Literal, dtype: DType) -> ValueId {
        let bytes = scalar_bytes(literal, dtype);
        self.param(
            TensorType::new(dtype, &[]),
            ParamSource::Host {
                bytes,
                dtype,
                dims: vec![],
            },
        )
    }

    /// Scalar argument `index` as a 0-d device input of `dtype`.
    pub fn scalar_arg(&mut self, index: usize, dtype: DType) -> Result<ValueId> {
        let literal = match self.arg(index)? {
            Arg::Float(v) => Literal::Float(*v),
            Arg::Int(v) => Literal::Int(*v),
            Arg::Bool(v) => Literal::Bool(*v),
            other => return Err(self.arg_error(index, "a Scalar", other.kind())),
        };
        Ok(self.scalar_input(literal, dtype))
    }

    /// A `ui64[2]` Threefry key from a generator's state, as a device input.
    pub fn rng_key(&mut self, seed: u64, offset: u64) -> ValueId {
        let mut bytes = seed.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&offset.to_ne_bytes());
        self.param(
            TensorType::new(DType::U64, &[2]),
            ParamSource::Host {
                bytes,
                dtype: DType::U64,
                dims: vec![2],
            },
        )
    }

    pub fn iota(&mut self, dtype: DType, dims: &[i64], dim: usize) -> ValueId {
        self.push(Node::Iota { dim }, TensorType::new(dtype, dims))
    }

    /// `op(x)`: of x's type, except that |x| and the parts of a complex
    /// `x` have its component dtype.
    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> ValueId {
        let mut ty = self.ty(x).clone();
        if matches!(op, UnaryOp::Abs | UnaryOp::Real | UnaryOp::Imag) {
            ty.dtype = ty.dtype.component();
        }
        self.push(Node::Unary(op, x), ty)
    }

    /// Elementwise binary op on operands of equal type.
    pub fn binary(&mut self, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        if self.ty(x) != self.ty(y) {
            return Err(Error::invalid(
                format!("{}: {op:?} operands", self.op),
                self.ty(x).to_string(),
                self.ty(y).to_string(),
            ));
        }
        let ty = self.ty(x).clone();
        // XLA's CPU compiler crashes (a segfault while emitting the
        // fusion) on a complex remainder, which ATen does not define.
        if op == BinaryOp::Rem && matches!(ty.dtype, DType::C64 | DType::C128) {
            return Err(Error::invalid(
                format!("{}: operands", self.op),
                "real tensors (a remainder of complex numbers is undefined)",
                ty.dtype,
            ));
        }
        Ok(self.push(Node::Binary(op, x, y), ty))
    }

    pub fn compare(
        &mut self,
        dir: crate::ir::CompareDir,
        x: ValueId,
        y: ValueId,
    ) -> Result<ValueId> {
        if self.ty(x) != self.ty(y) {
            return Err(Error::invalid(
                format!("{}: compare operands", self.op),
                self.ty(x).to_string(),
                self.ty(y).to_string(),
            ));
        }
        let dims = self.dims(x);
        Ok(self.push(
            Node::Compare(dir, x, y),
            TensorType::new(DType::Bool, &dims),
        ))
    }

    pub fn select(
        &mut self,
        pred: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    ) -> Result<ValueId> {
        if self.ty(on_true) != self.ty(on_false) || self.dims(pred) != self.dims(on_true) {
            return Err(Error::invalid(
                format!("{}: select operands", self.op),
                self.ty(on_true).to_string(),
                format!("{} and predicate {}", self.ty(on_false), self.ty(pred)),
            ));
        }
        let ty = self.ty(on_true).clone();
        Ok(self.push(
            Node::Select {
                pred,
                on_true,
                on_false,
            },
            ty,
        ))
    }

    /// Converts to `dtype` (no node when it already is).
    pub fn convert(&mut self, x: ValueId, dtype: DType) -> ValueId {
        if self.dtype(x) == dtype {
            return x;
        }
        let dims = self.dims(x);
        if dtype == DType::Bool {
            // Numeric → bool is "!= 0", which convert does not promise.
            let zero = self.constant(Literal::Int(0), self.dtype(x), &dims);
            return self.push(
                Node::Compare(crate::ir::CompareDir::Ne, x, zero),
                TensorType::new(DType::Bool, &dims),
            );
        }
        self.push(Node::Convert(x), TensorType::new(dtype, &dims))
    }

    /// The real (`imag`: imaginary) part of a complex `x`; `x` itself
    /// (zeros) for a real one.
    pub fn complex_part(&mut self, x: ValueId, imag: bool) -> ValueId {
        let dtype = self.dtype(x);
        let dims = self.dims(x);
        if dtype.category() != Category::Complex {
            return if imag {
                self.constant(Literal::Int(0), dtype, &dims)
            } else {
                x
            };
        }
        self.unary(if imag { UnaryOp::Imag } else { UnaryOp::Real }, x)
    }

    /// The complex value `re + i im` of two float32 (or float64) values of
    /// one type.
    pub fn complex(&mut self, re: ValueId, im: ValueId) -> Result<ValueId> {
        let ty = self.ty(re).clone();
        let complex = ty.dtype.complex_of().filter(|_| *self.ty(im) == ty);
        let Some(dtype) = complex else {
            return Err(Error::invalid(
                format!("{}: complex parts", self.op),
                "two float32 or float64 values of one shape",
                format!("{ty} and {}", self.ty(im)),
            ));
        };
        Ok(self.push(
            Node::Binary(BinaryOp::Complex, re, im),
            TensorType::new(dtype, &ty.dims),
        ))
    }

    /// The complex conjugate of `x`; `x` itself for a real one.
    pub fn conj(&mut self, x: ValueId) -> Result<ValueId> {
        if self.dtype(x).category() != Category::Complex {
            return Ok(x);
        }
        let re = self.complex_part(x, false);
        let im = self.complex_part(x, true);
        let minus_im = self.unary(UnaryOp::Neg, im);
        self.complex(re, minus_im)
    }

    pub fn bitcast(&mut self, x: ValueId, dtype: DType) -> ValueId {
        if self.dtype(x) == dtype {
            return x;
        }
        let dims = self.dims(x);
        self.push(Node::BitcastConvert(x), TensorType::new(dtype, &dims))
    }

    pub fn reshape(&mut self, x: ValueId, dims: &[i64]) -> Result<ValueId> {
        if self.dims(x) == dims {
            return Ok(x);
        }
        let numel: i64 = dims.iter().product();
        if numel != self.ty(x).numel() {
            return Err(Error::invalid(
                format!("{}: reshape", self.op),
                format!("{} elements", self.ty(x).numel()),
                format!("{dims:?}"),
            ));
        }
        let dtype = self.dtype(x);
        Ok(self.push(Node::Reshape(x), TensorType::new(dtype, dims)))
    }

    pub fn transpose(&mut self, x: ValueId, perm: &[i64]) -> ValueId {
        if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
            return x;
        }
        let src = self.dims(x);
        let dims: Vec<i64> = perm.iter().map(|&p| src[p as usize]).collect();
        let dtype = self.dtype(x);
        self.push(
            Node::Transpose {
                operand: x,
                perm: perm.to_vec(),
            },
            TensorType::new(dtype, &dims),
        )
    }

    /// `broadcast_in_dim`: operand dim i becomes result dim `dims[i]`.
    pub fn broadcast_in_dim(&mut self, x: ValueId, out_dims: &[i64], dims: &[i64]) -> ValueId {
        if self.dims(x) == out_dims && dims.iter().enumerate().all(|(i, &d)| d == i as i64) {
            return x;
        }
        let dtype = self.dtype(x);
        self.push(
            Node::Broadcast {
                operand: x,
                dims: dims.to_vec(),
            },
            TensorType::new(dtype, out_dims),
        )
    }

    /// NumPy-style broadcast of `x` to `out_dims` (trailing alignment).
    pub fn broadcast_to(&mut self, x: ValueId, out_dims: &[i64]) -> Result<ValueId> {
        let src = self.dims(x);
        if src == out_dims {
            return Ok(x);
        }
        if src.len() > out_dims.len() {
            return Err(Error::invalid(
                format!("{}: broadcast", self.op),
                format!("{out_dims:?}"),
                format!("{src:?}"),
            ));
        }
        let lead = out_dims.len() - src.len();
        // Size-1 source dims that stretch are dropped by a reshape first.
        let mut kept_dims = Vec::new();
        let mut kept_sizes = Vec::new();
        for (i, &s) in src.iter().enumerate() {
            let target = out_dims[lead + i];
            if s == target {
                kept_dims.push((lead + i) as i64);
                kept_sizes.push(s);
            } else if s != 1 {
                return Err(Error::invalid(
                    format!("{}: shapes for broadcasting", self.op),
                    format!("{src:?} to broadcast to {out_dims:?}"),
                    format!("size {s} against {target} at dim {i}"),
                ));
            }
        }
        let reshaped = self.reshape(x, &kept_sizes)?;
        Ok(self.broadcast_in_dim(reshaped, out_dims, &kept_dims))
    }

    pub fn slice(&mut self, x: ValueId, start: &[i64], limit: &[i64], strides: &[i64]) -> ValueId {
        let dims: Vec<i64> = start
            .iter()
            .zip(limit)
            .zip(strides)
            .map(|((s, l), st)| (l - s + st - 1) / st)
            .collect();
        if dims == self.dims(x) {
            return x;
        }
        let dtype = self.dtype(x);
        self.push(
            Node::Slice {
                operand: x,
                start: start.to_vec(),
                limit: limit.to_vec(),
                strides: strides.to_vec(),
            },
            TensorType::new(dtype, &dims),
        )
    }

    pub fn concat(&mut self, values: &[ValueId], dim: usize) -> Result<ValueId> {
        let first = self.dims(values[0]);
        let dtype = self.dtype(values[0]);
        let mut out = first.clone();
        out[dim] = 0;
        for &v in values {
            let d = self.dims(v);
            if d.len() != first.len() || self.dtype(v) != dtype {
                return Err(Error::invalid(
                    format!("{}: concatenated tensors", self.op),
                    self.ty(values[0]).to_string(),
                    self.ty(v).to_string(),
                ));
            }
            out[dim] += d[dim];
        }
        if values.len() == 1 {
            return Ok(values[0]);
        }
        Ok(self.push(
            Node::Concat {
                operands: values.to_vec(),
                dim,
            },
            TensorType::new(dtype, &out),
        ))
    }

    /// `dot_general` with result dims batch…, lhs free…, rhs free….
    pub fn dot(
        &mut self,
        lhs: ValueId,
        rhs: ValueId,
        batch: (&[i64], &[i64]),
        contract: (&[i64], &[i64]),
        out_dtype: DType,
    ) -> Result<ValueId> {
        let (l, r) = (self.dims(lhs), self.dims(rhs));
        for (&a, &b) in batch
            .0
            .iter()
            .zip(batch.1)
            .chain(contract.0.iter().zip(contract.1))
        {
            if l[a as usize] != r[b as usize] {
                return Err(Error::invalid(
                    format!("{}: matrix shapes", self.op),
                    format!("matching sizes for {l:?} and {r:?}"),
                    format!("{} against {}", l[a as usize], r[b as usize]),
                ));
            }
        }
        if self.larger_operand_goes_first(lhs, rhs, batch.0, contract) {
            let swapped = self.dot(rhs, lhs, (&[], &[]), (contract.1, contract.0), out_dtype)?;
            // Else XLA folds the transpose back into the dot.
            let ty = self.ty(swapped).clone();
            let kept = self.push(Node::OptimizationBarrier(swapped), ty);
            return Ok(self.transpose(kept, &[1, 0]));
        }
        let mut dims: Vec<i64> = batch.0.iter().map(|&d| l[d as usize]).collect();
        let free = |shape: &[i64], used: &[i64]| -> Vec<i64> {
            (0..shape.len() as i64)
                .filter(|d| !used.contains(d))
                .map(|d| shape[d as usize])
                .collect()
        };
        dims.extend(free(&l, &[batch.0, contract.0].concat()));
        dims.extend(free(&r, &[batch.1, contract.1].concat()));
        Ok(self.push(
            Node::Dot {
                lhs,
                rhs,
                lhs_batch: batch.0.to_vec(),
                rhs_batch: batch.1.to_vec(),
                lhs_contract: contract.0.to_vec(),
                rhs_contract: contract.1.to_vec(),
            },
            TensorType::new(out_dtype, &dims),
        ))
    }

    /// Whether a matrix product whose operands both contract their minor
    /// dim (a Linear layer's `x @ W.T`, once XLA folds the transpose into
    /// the dot) runs faster as `(W @ x.T).T`. XLA's CPU dot packs its right
    /// operand, and `xla-cpu-pjrt` packs one read that way slowly, so the
    /// larger operand goes on the left: a 128x1024 by (1024x1024).T product
    /// took 2.3 ms with the transpose back instead of 4.0 there, and the
    /// same 1.9 on a newer CPU plugin. The packing is paid once for all the
    /// left operand's rows: with 256-512 rows the swap still won (1.2-1.4x),
    /// at 768 it tied, at 1024 it lost (0.7-0.9x), so it stops at
    /// `MAX_ROWS_TO_SWAP`. Other platforms are left as built.
    fn larger_operand_goes_first(
        &self,
        lhs: ValueId,
        rhs: ValueId,
        batch: &[i64],
        contract: (&[i64], &[i64]),
    ) -> bool {
        let reads_minor_dim = |v: ValueId, dim: i64| {
            let transposed = matches!(&self.graph.nodes[v].0, Node::Transpose { perm, .. } if perm[..] == [1, 0]);
            (dim == 1) != transposed
        };
        const MAX_ROWS_TO_SWAP: i64 = 512;
        let (l, r) = (self.ty(lhs), self.ty(rhs));
        batch.is_empty()
            && l.dims.len() == 2
            && r.dims.len() == 2
            && contract.0.len() == 1
            && l.dims[1 - contract.0[0] as usize] <= MAX_ROWS_TO_SWAP
            && reads_minor_dim(lhs, contract.0[0])
            && reads_minor_dim(rhs, contract.1[0])
            && r.dims.iter().product::<i64>() > l.dims.iter().product::<i64>()
            && self.client.platform_name().is_ok_and(|name| name == "cpu")
    }

    pub fn reduce(&mut self, x: ValueId, op: crate::ir::ReduceOp, dims: &[i64]) -> ValueId {
        if dims.is_empty() {
            return x;
        }
        let src = self.dims(x);
        let out: Vec<i64> = (0..src.len())
            .filter(|d| !dims.contains(&(*d as i64)))
            .map(|d| src[d])
            .collect();
        let dtype = self.dtype(x);
        self.push(
            Node::Reduce {
                operand: x,
                op,
                dims: dims.to_vec(),
            },
            TensorType::new(dtype, &out),
        )
    }

    /// A convolution whose result shape the caller computed (`out_dims`);
    /// 16-bit float inputs accumulate into a float32 result (as ATen's CPU
    /// kernels do), which the caller rounds.
    #[allow(clippy::too_many_arguments)]
    pub fn convolution(
        &mut self,
        lhs: ValueId,
        rhs: ValueId,
        layouts: [&str; 3],
        window_strides: &[i64],
        padding: &[(i64, i64)],
        lhs_dilation: &[i64],
        rhs_dilation: &[i64],
        groups: (i64, i64),
        out_dims: &[i64],
    ) -> ValueId {
        let dtype = match self.dtype(lhs) {
            DType::F16 | DType::BF16 => DType::F32,
            other => other,
        };
        self.push(
            Node::Convolution {
                lhs,
                rhs,
                window: Box::new(ConvWindow {
                    layouts: layouts.map(str::to_string),
                    window_strides: window_strides.to_vec(),
                    padding: padding.to_vec(),
                    lhs_dilation: lhs_dilation.to_vec(),
                    rhs_dilation: rhs_dilation.to_vec(),
                    feature_group_count: groups.0,
                    batch_group_count: groups.1,
                }),
            },
            TensorType::new(dtype, out_dims),
        )
    }

    pub fn reverse(&mut self, x: ValueId, dims: &[i64]) -> ValueId {
        if dims.is_empty() {
            return x;
        }
        let ty = self.ty(x).clone();
        self.push(
            Node::Reverse {
                operand: x,
                dims: dims.to_vec(),
            },
            ty,
        )
    }

    /// Pads `x` with the literal `value` (negative low/high crop).
    pub fn pad(
        &mut self,
        x: ValueId,
        value: Literal,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> ValueId {
        let dtype = self.dtype(x);
        let src = self.dims(x);
        let dims: Vec<i64> = (0..src.len())
            .map(|d| src[d] + low[d] + high[d] + interior[d] * (src[d] - 1).max(0))
            .collect();
        let v = self.constant(value, dtype, &[]);
        self.push(
            Node::Pad {
                operand: x,
                value: v,
                low: low.to_vec(),
                high: high.to_vec(),
                interior: interior.to_vec(),
            },
            TensorType::new(dtype, &dims),
        )
    }

    /// Sliding-window reduction; the caller computes the result shape.
    pub fn reduce_window(
        &mut self,
        x: ValueId,
        op: crate::ir::ReduceOp,
        window: &[i64],
        strides: &[i64],
        padding: &[(i64, i64)],
        out_dims: &[i64],
    ) -> ValueId {
        let dtype = self.dtype(x);
        self.push(
            Node::ReduceWindow {
                operand: x,
                op,
                window: window.to_vec(),
                strides: strides.to_vec(),
                padding: padding.to_vec(),
            },
            TensorType::new(dtype, out_dims),
        )
    }

    /// Stable sort of `keys` along `dim`, carrying `payload`; returns
    /// (sorted keys, permuted payload).
    pub fn sort(
        &mut self,
        keys: ValueId,
        payload: ValueId,
        dim: usize,
        descending: bool,
    ) -> (ValueId, ValueId) {
        let (kt, pt) = (self.ty(keys).clone(), self.ty(payload).clone());
        let sorted = self.push(
            Node::Sort {
                keys,
                payload,
                dim: dim as i64,
                descending,
            },
            kt,
        );
        let moved = self.push(Node::SortPayload { sort: sorted }, pt);
        (sorted, moved)
    }

    pub fn rng_bits(&mut self, key: ValueId, dtype: DType, dims: &[i64]) -> ValueId {
        self.push(Node::RngBits { key }, TensorType::new(dtype, dims))
    }

    /// `flat` (1-D) with `updates` added at `indices` (an s64 tensor of the
    /// updates' shape); duplicate indices accumulate.
    pub fn flat_scatter_add(
        &mut self,
        flat: ValueId,
        indices: ValueId,
        updates: ValueId,
    ) -> ValueId {
        self.flat_scatter(flat, indices, updates, Some(crate::ir::ReduceOp::Sum))
    }

    /// `flat` (1-D) with `updates` stored at `indices` (an s64 tensor of the
    /// updates' shape), or combined with `combine`.
    pub fn flat_scatter(
        &mut self,
        flat: ValueId,
        indices: ValueId,
        updates: ValueId,
        combine: Option<crate::ir::ReduceOp>,
    ) -> ValueId {
        if self.ty(flat).numel() == 0 || self.ty(updates).numel() == 0 {
            return flat;
        }
        let ty = self.ty(flat).clone();
        self.push(
            Node::FlatScatter {
                combine,
                operand: flat,
                indices,
                updates,
            },
            ty,
        )
    }

    pub fn flat_gather(&mut self, flat: ValueId, indices: ValueId) -> ValueId {
        let dims = self.dims(indices);
        let dtype = self.dtype(flat);
        // Gathering from nothing (an empty input) can only produce nothing;
        // XLA rejects a gather from an empty operand.
        if self.ty(flat).numel() == 0 || self.ty(indices).numel() == 0 {
            return self.constant(Literal::Int(0), dtype, &dims);
        }
        self.push(
            Node::FlatGather {
                operand: flat,
                indices,
            },
            TensorType::new(dtype, &dims),
        )
    }
}

/// Host bytes of a scalar converted to `dtype` (PyTorch's scalar casts).
fn scalar_bytes(literal: Literal, dtype: DType) -> Vec<u8> {
    let f = literal.as_f64();
    let i = match literal {
        Literal::Float(x) => x as i64,
        Literal::Int(x) => x,
        Literal::Bool(x) => x as i64,
    };
    match dtype {
        DType::Bool => vec![(f != 0.0) as u8],
        DType::I8 => (i as i8).to_ne_bytes().to_vec(),
        DType::I16 => (i as i16).to_ne_bytes().to_vec(),
        DType::I32 => (i as i32).to_ne_bytes().to_vec(),
        DType::I64 => i.to_ne_bytes().to_vec(),
        DType::U8 => (i as u8).to_ne_bytes().to_vec(),
        DType::U16 => (i as u16).to_ne_bytes().to_vec(),
        DType::U32 => (i as u32).to_ne_bytes().to_vec(),
        DType::U64 => (i as u64).to_ne_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(f).to_bits().to_ne_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(f).to_bits().to_ne_bytes().to_vec(),
        DType::F32 => (f as f32).to_ne_bytes().to_vec(),
        DType::F64 => f.to_ne_bytes().to_vec(),
        DType::C64 => [(f as f32).to_ne_bytes(), 0f32.to_ne_bytes()].concat(),
        DType::C128 => [f.to_ne_bytes(), 0f64.to_ne_bytes()].concat(),
    }
}
