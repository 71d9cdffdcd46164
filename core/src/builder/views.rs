//! Input checks, reading and writing strided views of storages, and the
//! op's outputs.

use std::sync::Arc;

use super::{host_values, Builder, Mode, ParamSource, PendingOutput, StorageSlot, TensorArg};
use crate::dtype::{Category, DType};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Literal, Node, TensorType, ValueId};
use crate::storage::{Storage, StorageValue, View};

impl<'a> Builder<'a> {
    // ----- input checks ---------------------------------------------------

    /// Checks that every element of integer tensor `t` lies in `[low, high)`
    /// (or equals `ignore`); `error` describes the first bad value. Values
    /// at hand are checked on the host now; a value a pending graph computes
    /// (reading it would run the graph mid-step), or any value during a
    /// capture, is checked on the device instead, and a failure is raised at
    /// the next sync point.
    pub fn check_range(
        &mut self,
        t: &TensorArg,
        (low, high): (i64, i64),
        ignore: Option<i64>,
        error: impl Fn(String) -> Error,
    ) -> Result<()> {
        // A captured graph checks on the device too, so its replays do.
        let on_device = match self.mode {
            Mode::Eager => false,
            Mode::Capture => true,
            Mode::Deferred => {
                matches!(t.storage.recorded_value(), StorageValue::Pending { .. })
            }
        };
        if !on_device {
            let values = host_values(t)?;
            let bad = values
                .iter()
                .find(|&&v| Some(v) != ignore && (v < low || v >= high));
            return match bad {
                Some(bad) => Err(error(bad.to_string())),
                None => Ok(()),
            };
        }
        let v = self.read(t)?;
        let v = self.convert(v, DType::I64);
        let dims = self.dims(v);
        let low_v = self.constant(Literal::Int(low), DType::I64, &dims);
        let high_v = self.constant(Literal::Int(high), DType::I64, &dims);
        let below = self.compare(crate::ir::CompareDir::Lt, v, low_v)?;
        let above = self.compare(crate::ir::CompareDir::Ge, v, high_v)?;
        let mut bad = self.binary(BinaryOp::Or, below, above)?;
        if let Some(ignore) = ignore {
            let ignore_v = self.constant(Literal::Int(ignore), DType::I64, &dims);
            let kept = self.compare(crate::ir::CompareDir::Ne, v, ignore_v)?;
            bad = self.binary(BinaryOp::And, bad, kept)?;
        }
        let all: Vec<i64> = (0..dims.len() as i64).collect();
        let flag = self.reduce(bad, crate::ir::ReduceOp::Or, &all);
        self.checks
            .push((flag, error("(found on the device)".into())));
        Ok(())
    }

    // ----- storages and views -------------------------------------------

    fn slot(&mut self, storage: &Arc<Storage>, view: &View) -> Result<usize> {
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| Arc::ptr_eq(&s.storage, storage))
        {
            return Ok(i);
        }
        // Buffers of another client (another rtpu_runtime) cannot be inputs
        // of this one's programs.
        if storage.client().id() != self.client.id() {
            return Err(Error::invalid(
                format!("{}: tensors' runtimes", self.op),
                "storages of the runtime the op is called with",
                "a storage of another runtime",
            ));
        }
        self.use_device(storage.device_index())?;
        let value = if self.mode != Mode::Eager {
            storage.recorded_value()
        } else {
            storage.value()?
        };
        let mut param = None;
        let flat = match value {
            StorageValue::Buffer { buffer, dtype } => {
                let elements = storage.elements(dtype)? as i64;
                let source = if self.mode != Mode::Eager {
                    ParamSource::Recorded {
                        storage: storage.clone(),
                        view: view.clone(),
                    }
                } else {
                    param = Some(self.graph.params.len());
                    ParamSource::Storage(buffer)
                };
                self.param(TensorType::new(dtype, &[elements]), source)
            }
            // A sharded value is read by recording: the op runs as an SPMD
            // program (in eager mode too, flushed at once).
            StorageValue::Pending { dtype } | StorageValue::Sharded { dtype, .. } => {
                let elements = storage.elements(dtype)? as i64;
                self.param(
                    TensorType::new(dtype, &[elements]),
                    ParamSource::Recorded {
                        storage: storage.clone(),
                        view: view.clone(),
                    },
                )
            }
            StorageValue::Failed { code, message } => {
                return Err(Error::LostValue { code, message })
            }
            // Never written: zeros, typed as bytes until a reader types it.
            StorageValue::Zeros => {
                let elements = storage.nbytes() as i64;
                self.constant(Literal::Int(0), DType::U8, &[elements])
            }
        };
        self.slots.push(StorageSlot {
            storage: storage.clone(),
            flat,
            param,
            written: false,
        });
        Ok(self.slots.len() - 1)
    }

    /// The slot's flat value seen as `dtype`: a bitcast for another dtype of
    /// the same width, a zeros constant for a never-written storage, and
    /// complex values as their interleaved parts (`x.real`,
    /// `view_as_real`) or back (`view_as_complex`).
    fn flat_as(&mut self, slot: usize, dtype: DType) -> Result<ValueId> {
        let flat = self.slots[slot].flat;
        let have = self.dtype(flat);
        if have == dtype {
            return Ok(flat);
        }
        let storage = self.slots[slot].storage.clone();
        let elements = storage.elements(dtype)? as i64;
        if matches!(self.graph.nodes[flat].0, Node::Constant(Literal::Int(0))) {
            return Ok(self.constant(Literal::Int(0), dtype, &[elements]));
        }
        let width = dtype.size_in_bytes();
        if have.category() == Category::Complex && width == have.component().size_in_bytes() {
            let n = self.dims(flat)[0];
            let re = self.complex_part(flat, false);
            let im = self.complex_part(flat, true);
            let re = self.reshape(re, &[n, 1])?;
            let im = self.reshape(im, &[n, 1])?;
            let pairs = self.concat(&[re, im], 1)?;
            let interleaved = self.reshape(pairs, &[2 * n])?;
            return Ok(self.bitcast(interleaved, dtype));
        }
        if dtype.category() == Category::Complex
            && have.size_in_bytes() == dtype.component().size_in_bytes()
        {
            let n = elements;
            let flat = self.bitcast(flat, dtype.component());
            let pairs = self.reshape(flat, &[n, 2])?;
            let [re, im] = [0, 1].map(|i| self.slice(pairs, &[0, i], &[n, i + 1], &[1, 1]));
            let (re, im) = (self.reshape(re, &[n])?, self.reshape(im, &[n])?);
            return self.complex(re, im);
        }
        if have.size_in_bytes() != width || dtype == DType::Bool || have == DType::Bool {
            return Err(Error::invalid(
                format!("{}: a storage holding {have} read as {dtype}", self.op),
                format!("a dtype of {} bytes", have.size_in_bytes()),
                format!("{} bytes", dtype.size_in_bytes()),
            ));
        }
        Ok(self.bitcast(flat, dtype))
    }

    /// Elements `offset..offset + len` of a flat value. A nonzero offset is
    /// an input, not part of the program, so reading element i of a tensor
    /// compiles once for every i.
    fn flat_window(&mut self, flat: ValueId, offset: i64, len: i64) -> ValueId {
        if offset == 0 {
            return self.slice(flat, &[0], &[len], &[1]);
        }
        let start = self.scalar_input(Literal::Int(offset), DType::I64);
        let dtype = self.dtype(flat);
        self.push(
            Node::DynamicSlice {
                operand: flat,
                start,
                size: len,
            },
            TensorType::new(dtype, &[len]),
        )
    }

    /// Storage element indices of `view` as an s64 tensor of its sizes.
    fn view_indices(&mut self, view: &View) -> ValueId {
        let dims = view.sizes.clone();
        let mut acc = self.constant(Literal::Int(view.offset), DType::I64, &dims);
        for (d, (&size, &stride)) in view.sizes.iter().zip(&view.strides).enumerate() {
            if size <= 1 || stride == 0 {
                continue;
            }
            let iota = self.iota(DType::I64, &dims, d);
            let s = self.constant(Literal::Int(stride), DType::I64, &dims);
            let term = self.push(
                Node::Binary(BinaryOp::Mul, iota, s),
                TensorType::new(DType::I64, &dims),
            );
            acc = self.push(
                Node::Binary(BinaryOp::Add, acc, term),
                TensorType::new(DType::I64, &dims),
            );
        }
        acc
    }

    /// Reads `view` of the flat value: slice + reshape + transpose +
    /// broadcast when the strides are a permuted contiguous layout, a gather
    /// otherwise.
    fn read_view(&mut self, flat: ValueId, view: &View) -> Result<ValueId> {
        let numel = view.numel() as i64;
        if numel == 0 {
            return Ok(self.constant(Literal::Int(0), view.dtype, &view.sizes));
        }
        // The whole storage in order, as most reads are: a reshape.
        if view.is_whole(self.ty(flat).numel() as usize * view.dtype.size_in_bytes()) {
            return self.reshape(flat, &view.sizes);
        }
        // Dims that really step through memory, outermost first.
        let mut stepping: Vec<usize> = (0..view.sizes.len())
            .filter(|&d| view.sizes[d] > 1 && view.strides[d] != 0)
            .collect();
        stepping.sort_by_key(|&d| std::cmp::Reverse(view.strides[d]));
        let dense = stepping.iter().rev().try_fold(1i64, |expected, &d| {
            (view.strides[d] == expected).then_some(expected * view.sizes[d])
        });
        let Some(span) = dense else {
            let indices = self.view_indices(view);
            return Ok(self.flat_gather(flat, indices));
        };
        let base = self.flat_window(flat, view.offset, span);
        let sorted_sizes: Vec<i64> = stepping.iter().map(|&d| view.sizes[d]).collect();
        let shaped = self.reshape(base, &sorted_sizes)?;
        // Transpose the stepping dims into their order in the view.
        let mut in_view_order: Vec<usize> = stepping.clone();
        in_view_order.sort();
        let perm: Vec<i64> = in_view_order
            .iter()
            .map(|d| stepping.iter().position(|s| s == d).unwrap_or(0) as i64)
            .collect();
        let ordered = self.transpose(shaped, &perm);
        // Insert size-1 and broadcast (stride 0) dims.
        let targets: Vec<i64> = in_view_order.iter().map(|&d| d as i64).collect();
        Ok(self.broadcast_in_dim(ordered, &view.sizes, &targets))
    }

    /// Reads tensor argument `index` as a value of its sizes and dtype.
    pub fn tensor(&mut self, index: usize) -> Result<ValueId> {
        let t = self.tensor_arg(index)?;
        self.read(t)
    }

    /// Reads a tensor (e.g. an element of a Tensor[] argument).
    pub fn read(&mut self, t: &TensorArg) -> Result<ValueId> {
        let slot = self.slot(&t.storage, &t.view)?;
        let flat = self.flat_as(slot, t.view.dtype)?;
        self.read_view(flat, &t.view)
    }

    /// Writes `value` (converted to the view's dtype, broadcast to its sizes)
    /// into tensor `t`, as a new version of its storage.
    pub fn write(&mut self, t: &TensorArg, value: ValueId) -> Result<()> {
        let slot = self.slot(&t.storage, &t.view)?;
        let elements = t.storage.elements(t.view.dtype)? as i64;
        // One value written through an expanded view (fill_, zero_) is
        // well-defined: it is written once per distinct element.
        let view = &if self.dims(value).is_empty() {
            t.view.without_repeated_dims()
        } else {
            t.view.clone()
        };
        view.check_writable(elements as usize)?;
        let value = self.convert(value, view.dtype);
        let value = self.broadcast_to(value, &view.sizes)?;
        if view.numel() == 0 {
            return Ok(());
        }
        let numel = view.numel() as i64;
        let flat_value = if view.is_whole(t.storage.nbytes()) {
            self.flat_elementwise(value, elements, &mut Vec::new())?
        } else {
            let flat = self.flat_as(slot, view.dtype)?;
            if view.is_contiguous() {
                let update = self.reshape(value, &[numel])?;
                let ty = self.ty(flat).clone();
                // The offset is an input: writing the next row is the same
                // program.
                let start = self.scalar_input(Literal::Int(view.offset), DType::I64);
                self.push(
                    Node::DynamicUpdateSlice {
                        operand: flat,
                        update,
                        start,
                    },
                    ty,
                )
            } else {
                let indices = self.view_indices(view);
                let ty = self.ty(flat).clone();
                self.push(
                    Node::FlatScatter {
                        combine: None,
                        operand: flat,
                        indices,
                        updates: value,
                    },
                    ty,
                )
            }
        };
        self.slots[slot].flat = flat_value;
        self.slots[slot].written = true;
        Ok(())
    }

    /// `value` reshaped to the flat `[elements]` a whole storage holds. An
    /// elementwise computation (an optimizer's update, `mul_`, `add_`) is
    /// redone on flat operands instead, down to the storages' flat values
    /// it read through reshapes: XLA writes a donated buffer in place only
    /// when the last op is elementwise in the buffer's shape, and copies
    /// the result of a reshape into it. `flat_of` memoizes what is
    /// already redone, so a value read twice is redone once.
    fn flat_elementwise(
        &mut self,
        value: ValueId,
        elements: i64,
        flat_of: &mut Vec<(ValueId, ValueId)>,
    ) -> Result<ValueId> {
        if let Some(&(_, flat)) = flat_of.iter().find(|(v, _)| *v == value) {
            return Ok(flat);
        }
        let (node, ty) = self.graph.nodes[value].clone();
        let flat_ty = TensorType::new(ty.dtype, &[elements]);
        let flat = match node {
            _ if ty.dims == [elements] => value,
            Node::Reshape(x) if self.graph.ty(x).dims == [elements] => x,
            // A literal or a scalar broadcast to any shape.
            Node::Constant(_) => self.push(node, flat_ty),
            Node::Broadcast { operand, .. } if self.graph.ty(operand).dims.is_empty() => {
                self.broadcast_in_dim(operand, &[elements], &[])
            }
            Node::Unary(..)
            | Node::Binary(..)
            | Node::Compare(..)
            | Node::Select { .. }
            | Node::Convert(_)
                if self.operands_shaped_as(&node, &ty.dims) =>
            {
                let mut operands = Vec::new();
                node.for_each_operand(|v| operands.push(v));
                let mut flat_operands = Vec::with_capacity(operands.len());
                for v in operands {
                    flat_operands.push(self.flat_elementwise(v, elements, flat_of)?);
                }
                let mut node = node;
                let mut next = flat_operands.into_iter();
                node.for_each_operand_mut(|v| *v = next.next().unwrap_or(*v));
                self.push(node, flat_ty)
            }
            _ => self.reshape(value, &[elements])?,
        };
        flat_of.push((value, flat));
        Ok(flat)
    }

    /// Whether every operand of `node` has `dims` (elementwise nodes may
    /// also take a scalar, as `select` its predicate).
    fn operands_shaped_as(&self, node: &Node, dims: &[i64]) -> bool {
        let mut all = true;
        node.for_each_operand(|v| all &= self.graph.ty(v).dims == dims);
        all
    }

    /// Writes `value` into tensor argument `index` and returns it as an output.
    pub fn write_arg(&mut self, index: usize, value: ValueId) -> Result<()> {
        let t = self.tensor_arg(index)?;
        self.write(t, value)?;
        self.outputs.push(PendingOutput::Alias(index));
        Ok(())
    }

    /// Returns argument `index` as an output without writing it.
    pub fn alias_output(&mut self, index: usize) {
        self.outputs.push(PendingOutput::Alias(index));
    }

    /// Returns no tensor in this output position.
    pub fn none_output(&mut self) {
        self.outputs.push(PendingOutput::None);
    }

    /// Returns `value` as a new contiguous tensor.
    pub fn output(&mut self, value: ValueId) -> Result<()> {
        let sizes = self.dims(value);
        // Sizes an op computed from its arguments (eye's n x m) may not
        // have an element count at all, or (with a 0 among them) contiguous
        // strides that do not fit.
        sizes
            .iter()
            .try_fold(1i64, |acc, &s| acc.checked_mul(s.max(1)))
            .ok_or_else(|| {
                Error::invalid(
                    format!("{}: output", self.op),
                    "sizes whose element count and strides fit in 64 bits",
                    format!("{sizes:?}"),
                )
            })?;
        let numel = sizes.iter().product::<i64>();
        let flat = self.reshape(value, &[numel])?;
        self.outputs.push(PendingOutput::New { value: flat, sizes });
        Ok(())
    }
}
