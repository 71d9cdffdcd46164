//! The eager engine: runs one ATen op as one XLA program.
//!
//! An op's lowering (in `ops`) describes its computation on a `Builder`: it
//! reads tensor arguments (strided views of storages become slices,
//! transposes, broadcasts or gathers of the storage's flat buffer), takes
//! scalar arguments as device inputs (so a changing learning rate does not
//! recompile), and either returns new tensors or writes into argument views
//! (a new version of the storage: update-slice or scatter). The engine lowers
//! the graph to StableHLO, compiles it once per distinct text and device, runs
//! it, and installs the results.

pub mod cache;
pub mod capture;
pub mod deferred;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Graph, Literal, Node, TensorType, UnaryOp, ValueId};
use crate::metrics::{self, Metric};
use crate::ops;
use crate::runtime::{Buffer, Client, ExecuteOptions};
use crate::storage::{self, PendingWork, Storage, StorageValue, View};

/// A tensor argument: a view of a storage.
#[derive(Clone)]
pub struct TensorArg {
    pub storage: Arc<Storage>,
    pub view: View,
}

/// One op argument, mirroring `c10::IValue`.
#[derive(Clone)]
pub enum Arg {
    None,
    Tensor(TensorArg),
    Int(i64),
    Float(f64),
    Bool(bool),
    IntList(Vec<i64>),
    FloatList(Vec<f64>),
    TensorList(Vec<Option<TensorArg>>),
    ScalarType(DType),
    Str(String),
    /// A device index of the client.
    Device(i64),
    Generator {
        seed: u64,
        offset: u64,
    },
}

impl Arg {
    pub fn kind(&self) -> &'static str {
        match self {
            Arg::None => "None",
            Arg::Tensor(_) => "Tensor",
            Arg::Int(_) => "int",
            Arg::Float(_) => "float",
            Arg::Bool(_) => "bool",
            Arg::IntList(_) => "int[]",
            Arg::FloatList(_) => "float[]",
            Arg::TensorList(_) => "Tensor[]",
            Arg::ScalarType(_) => "ScalarType",
            Arg::Str(_) => "str",
            Arg::Device(_) => "Device",
            Arg::Generator { .. } => "Generator",
        }
    }
}

/// One result of an op.
pub enum Output {
    /// The op wrote into argument `index` (in-place and out= ops) and returns it.
    Alias(usize),
    /// A new tensor.
    New { storage: Arc<Storage>, view: View },
    /// No tensor (an undefined tensor in ATen), e.g. a gradient that
    /// `output_mask` did not ask for.
    None,
}

/// The engine's side of storages' pending values (`storage::PendingWork`).
struct EngineWork;

impl PendingWork for EngineWork {
    fn flush_device(&self, client: &Client, device_index: usize) -> Result<()> {
        deferred::flush_device(client, device_index)
    }

    fn note_host_read(&self) {
        capture::note_host_read()
    }

    fn verify_checks(&self) -> Result<()> {
        deferred::verify_checks()
    }
}

/// Called by the entries that can make pending values, captures or device
/// checks (op calls, captures) before they do.
pub(super) fn install_pending_work() {
    storage::set_pending_work(&EngineWork);
}

/// Schema names of the ops the engine runs; an op's id is its index here.
pub fn op_names() -> Vec<&'static str> {
    ops::table().iter().map(|op| op.name).collect()
}

/// The id of the op with this schema name.
pub fn find_op(name: &str) -> Option<usize> {
    ops::table().iter().position(|op| op.name == name)
}

/// Runs op `op` (an index into `op_names()`) on `args`.
pub fn call(client: &Client, op: usize, args: &[Arg]) -> Result<Vec<Output>> {
    let def = ops::table()
        .get(op)
        .ok_or_else(|| Error::invalid("op id", format!("less than {}", ops::table().len()), op))?;
    install_pending_work();
    let start = Instant::now();
    let mut builder = Builder::new(client, def.name, args);
    let deferred = builder.deferred;
    (def.lower)(&mut builder)?;
    let outputs = builder.run()?;
    if deferred {
        metrics::add_elapsed(Metric::RecordNs, start);
    } else {
        metrics::add(Metric::OpsRun, 1);
    }
    Ok(outputs)
}

/// What feeds one graph parameter at execution time.
enum ParamSource {
    Storage(Arc<Buffer>),
    /// A storage's value in the pending graph (deferred mode), resolved
    /// when the op is recorded; `view` is how the op first read it (what
    /// recompile explanations show).
    Recorded {
        storage: Arc<Storage>,
        view: View,
    },
    Host {
        bytes: Vec<u8>,
        dtype: DType,
        dims: Vec<i64>,
    },
}

/// A storage the op reads or writes, with its current flat value in the graph.
struct StorageSlot {
    storage: Arc<Storage>,
    /// The flat value as stored (dtype of the storage's value).
    flat: ValueId,
    written: bool,
}

enum PendingOutput {
    Alias(usize),
    New { value: ValueId, sizes: Vec<i64> },
    None,
}

/// Builds one op's graph. Ops use its typed helpers; every helper checks
/// shapes and dtypes so a mismatch is an error, not a bad program.
pub struct Builder<'a> {
    client: &'a Client,
    op: &'static str,
    args: &'a [Arg],
    graph: Graph,
    sources: Vec<ParamSource>,
    slots: Vec<StorageSlot>,
    outputs: Vec<PendingOutput>,
    device_index: Option<usize>,
    /// Record into the pending graph instead of running now.
    deferred: bool,
    /// Device-side checks (deferred mode): a bool flag that is true when
    /// the op's input was bad, and the error to raise then.
    checks: Vec<(ValueId, Error)>,
}

impl<'a> Builder<'a> {
    fn new(client: &'a Client, op: &'static str, args: &'a [Arg]) -> Builder<'a> {
        Builder {
            client,
            op,
            args,
            graph: Graph::default(),
            sources: Vec::new(),
            slots: Vec::new(),
            outputs: Vec::new(),
            device_index: None,
            deferred: deferred::is_deferred(),
            checks: Vec::new(),
        }
    }

    pub fn op_name(&self) -> &'static str {
        self.op
    }

    /// An error about argument `index` of this op.
    pub fn arg_error(
        &self,
        index: usize,
        expected: impl std::fmt::Display,
        got: impl std::fmt::Display,
    ) -> Error {
        Error::invalid(format!("{} argument {index}", self.op), expected, got)
    }

    // ----- arguments -----------------------------------------------------

    pub fn arg(&self, index: usize) -> Result<&'a Arg> {
        self.args.get(index).ok_or_else(|| {
            self.arg_error(
                index,
                "an argument",
                format!("{} arguments", self.args.len()),
            )
        })
    }

    pub fn num_args(&self) -> usize {
        self.args.len()
    }

    pub fn tensor_arg(&self, index: usize) -> Result<&'a TensorArg> {
        match self.arg(index)? {
            Arg::Tensor(t) => Ok(t),
            other => Err(self.arg_error(index, "a Tensor", other.kind())),
        }
    }

    pub fn opt_tensor_arg(&self, index: usize) -> Result<Option<&'a TensorArg>> {
        match self.args.get(index) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::Tensor(t)) => Ok(Some(t)),
            Some(other) => Err(self.arg_error(index, "a Tensor or None", other.kind())),
        }
    }

    pub fn tensor_list_arg(&self, index: usize) -> Result<Vec<&'a TensorArg>> {
        match self.arg(index)? {
            Arg::TensorList(items) => items
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    t.as_ref()
                        .ok_or_else(|| self.arg_error(index, "tensors", format!("None at {i}")))
                })
                .collect(),
            other => Err(self.arg_error(index, "a Tensor[]", other.kind())),
        }
    }

    pub fn int_arg(&self, index: usize) -> Result<i64> {
        match self.arg(index)? {
            Arg::Int(v) => Ok(*v),
            Arg::Bool(v) => Ok(*v as i64),
            other => Err(self.arg_error(index, "an int", other.kind())),
        }
    }

    pub fn opt_int_arg(&self, index: usize) -> Result<Option<i64>> {
        match self.args.get(index) {
            None | Some(Arg::None) => Ok(None),
            _ => self.int_arg(index).map(Some),
        }
    }

    pub fn bool_arg(&self, index: usize) -> Result<bool> {
        match self.arg(index)? {
            Arg::Bool(v) => Ok(*v),
            Arg::Int(v) => Ok(*v != 0),
            other => Err(self.arg_error(index, "a bool", other.kind())),
        }
    }

    pub fn float_arg(&self, index: usize) -> Result<f64> {
        match self.arg(index)? {
            Arg::Float(v) => Ok(*v),
            Arg::Int(v) => Ok(*v as f64),
            Arg::Bool(v) => Ok(*v as i64 as f64),
            other => Err(self.arg_error(index, "a float", other.kind())),
        }
    }

    pub fn int_list_arg(&self, index: usize) -> Result<Vec<i64>> {
        match self.arg(index)? {
            Arg::IntList(v) => Ok(v.clone()),
            Arg::Int(v) => Ok(vec![*v]),
            other => Err(self.arg_error(index, "an int[]", other.kind())),
        }
    }

    pub fn opt_int_list_arg(&self, index: usize) -> Result<Option<Vec<i64>>> {
        match self.args.get(index) {
            None | Some(Arg::None) => Ok(None),
            _ => self.int_list_arg(index).map(Some),
        }
    }

    pub fn opt_dtype_arg(&self, index: usize) -> Result<Option<DType>> {
        match self.args.get(index) {
            None | Some(Arg::None) => Ok(None),
            Some(Arg::ScalarType(d)) => Ok(Some(*d)),
            Some(other) => Err(self.arg_error(index, "a ScalarType or None", other.kind())),
        }
    }

    /// True when argument `index` is a Python number (a `Scalar`).
    pub fn is_scalar(&self, index: usize) -> bool {
        matches!(
            self.args.get(index),
            Some(Arg::Int(_) | Arg::Float(_) | Arg::Bool(_))
        )
    }

    /// Chooses the device the op runs on; all tensors must share it.
    pub fn use_device(&mut self, index: usize) -> Result<()> {
        match self.device_index {
            Some(current) if current != index => Err(Error::invalid(
                format!("{}: tensors' devices", self.op),
                format!("all on tpu:{current}"),
                format!("a tensor on tpu:{index}"),
            )),
            _ => {
                if index >= self.client.device_count() {
                    return Err(Error::invalid(
                        "device index",
                        format!("less than {}", self.client.device_count()),
                        index,
                    ));
                }
                self.device_index = Some(index);
                Ok(())
            }
        }
    }

    // ----- graph construction -------------------------------------------

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.graph.ty(v)
    }

    pub fn dims(&self, v: ValueId) -> Vec<i64> {
        self.graph.ty(v).dims.clone()
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.graph.ty(v).dtype
    }

    fn push(&mut self, node: Node, ty: TensorType) -> ValueId {
        self.graph.nodes.push((node, ty));
        self.graph.nodes.len() - 1
    }

    fn param(&mut self, ty: TensorType, source: ParamSource) -> ValueId {
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

    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> ValueId {
        let ty = self.ty(x).clone();
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
                layouts: layouts.map(str::to_string),
                window_strides: window_strides.to_vec(),
                padding: padding.to_vec(),
                lhs_dilation: lhs_dilation.to_vec(),
                rhs_dilation: rhs_dilation.to_vec(),
                feature_group_count: groups.0,
                batch_group_count: groups.1,
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
        let on_device = self.deferred
            && (capture::is_capturing()
                || matches!(t.storage.recorded_value(), StorageValue::Pending { .. }));
        if !on_device {
            let values = ops::index::host_values(t)?;
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
        self.use_device(storage.device_index())?;
        let value = if self.deferred {
            storage.recorded_value()
        } else {
            storage.value()?
        };
        let flat = match value {
            StorageValue::Buffer { buffer, dtype } => {
                let elements = storage.elements(dtype)? as i64;
                let source = if self.deferred {
                    ParamSource::Recorded {
                        storage: storage.clone(),
                        view: view.clone(),
                    }
                } else {
                    ParamSource::Storage(buffer)
                };
                self.param(TensorType::new(dtype, &[elements]), source)
            }
            StorageValue::Pending { dtype } => {
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
            written: false,
        });
        Ok(self.slots.len() - 1)
    }

    /// The slot's flat value seen as `dtype`: a bitcast for another dtype of
    /// the same width, a zeros constant for a never-written storage.
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
        if have.size_in_bytes() != dtype.size_in_bytes()
            || dtype == DType::Bool
            || have == DType::Bool
        {
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
        t.view.check_within(t.storage.elements(t.view.dtype)?)?;
        let flat = self.flat_as(slot, t.view.dtype)?;
        self.read_view(flat, &t.view)
    }

    /// Writes `value` (converted to the view's dtype, broadcast to its sizes)
    /// into tensor `t`, as a new version of its storage.
    pub fn write(&mut self, t: &TensorArg, value: ValueId) -> Result<()> {
        let view = &t.view;
        let slot = self.slot(&t.storage, &t.view)?;
        let elements = t.storage.elements(view.dtype)? as i64;
        view.check_within(elements as usize)?;
        let value = self.convert(value, view.dtype);
        let value = self.broadcast_to(value, &view.sizes)?;
        if view.numel() == 0 {
            return Ok(());
        }
        let numel = view.numel() as i64;
        let flat_value = if view.offset == 0 && view.is_contiguous() && numel == elements {
            self.reshape(value, &[elements])?
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
        let flat = self.reshape(value, &[sizes.iter().product()])?;
        self.outputs.push(PendingOutput::New { value: flat, sizes });
        Ok(())
    }

    // ----- execution -----------------------------------------------------

    /// TPUs have no 64-bit floats: a float64 (or complex128) op there is a
    /// clear error, never a silently narrowed result.
    fn check_platform_dtypes(&self) -> Result<()> {
        if !self.client.platform_name()?.eq_ignore_ascii_case("tpu") {
            return Ok(());
        }
        let wide = |t: &TensorType| matches!(t.dtype, DType::F64 | DType::C128);
        let uses_wide =
            self.graph.params.iter().any(wide) || self.graph.nodes.iter().any(|(_, t)| wide(t));
        if uses_wide {
            return Err(Error::invalid(
                format!("{}: dtype", self.op),
                "a dtype the TPU supports (float32, bfloat16, float16, integers, bool)",
                "float64, which TPUs do not have; convert with .float() first",
            ));
        }
        Ok(())
    }

    fn run(mut self) -> Result<Vec<Output>> {
        let device_index = self.device_index.unwrap_or(0);
        let mut graph_outputs = Vec::new();
        for out in &self.outputs {
            if let PendingOutput::New { value, .. } = out {
                graph_outputs.push(*value);
            }
        }
        let written: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].written)
            .collect();
        for &i in &written {
            graph_outputs.push(self.slots[i].flat);
        }
        if graph_outputs.is_empty() {
            return Ok(self
                .outputs
                .iter()
                .map(|o| match o {
                    PendingOutput::Alias(i) => Output::Alias(*i),
                    PendingOutput::None => Output::None,
                    PendingOutput::New { .. } => unreachable!("a new output is a graph output"),
                })
                .collect());
        }
        self.check_platform_dtypes()?;
        if self.deferred {
            return deferred::record(self, device_index);
        }
        self.graph.outputs = graph_outputs;
        let exe = cache::executable(self.client, device_index, &self.graph, None)?;
        let device = self.client.device(device_index)?;
        let mut args = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            args.push(match source {
                ParamSource::Storage(buffer) => buffer.clone(),
                ParamSource::Host { bytes, dtype, dims } => {
                    host_input(self.client, device_index, &device, bytes, *dtype, dims)?
                }
                ParamSource::Recorded { .. } => {
                    return Err(Error::invalid(
                        format!("{}: an input", self.op),
                        "a device buffer in eager mode",
                        "a value recorded for deferred mode",
                    ))
                }
            });
        }
        let args: Vec<&Buffer> = args.iter().map(Arc::as_ref).collect();
        let start = Instant::now();
        let launched = exe.execute(
            &[&args],
            // Later reads wait for the values; the host goes on meanwhile.
            &ExecuteOptions {
                donate: Vec::new(),
                asynchronous: true,
            },
        );
        metrics::add_elapsed(Metric::ExecuteNs, start);
        let mut results = launched?.into_iter().next().unwrap_or_default().into_iter();

        let mut outputs = Vec::with_capacity(self.outputs.len());
        for out in &self.outputs {
            outputs.push(match out {
                PendingOutput::Alias(i) => Output::Alias(*i),
                PendingOutput::None => Output::None,
                PendingOutput::New { value, sizes } => {
                    let buffer = results.next().ok_or_else(|| {
                        Error::invalid("program outputs", "one per result", "fewer")
                    })?;
                    let dtype = self.graph.ty(*value).dtype;
                    let storage = Storage::from_buffer(self.client, device_index, buffer, dtype)?;
                    Output::New {
                        storage,
                        view: View::contiguous(sizes, dtype),
                    }
                }
            });
        }
        for &i in &written {
            let buffer = results.next().ok_or_else(|| {
                Error::invalid("program outputs", "one per written storage", "fewer")
            })?;
            let dtype = self.graph.ty(self.slots[i].flat).dtype;
            self.slots[i].storage.set_value(buffer, dtype)?;
        }
        Ok(outputs)
    }
}

type HostInputKey = (usize, usize, DType, Vec<i64>, Vec<u8>);

/// A device buffer holding small host input `bytes`. Scalars repeat (a fixed
/// learning rate, alpha = -1, eps), so buffers are cached by value: an
/// upload costs more than the op itself on small tensors. Buffers passed as
/// inputs are never donated, so sharing them is safe.
pub(crate) fn host_input(
    client: &Client,
    device_index: usize,
    device: &crate::runtime::Device,
    bytes: &[u8],
    dtype: DType,
    dims: &[i64],
) -> Result<Arc<Buffer>> {
    const MAX_ENTRIES: usize = 4096;
    // Only scalars and tiny tensors repeat often enough to be worth keeping.
    const MAX_CACHED_BYTES: usize = 64;
    if bytes.len() > MAX_CACHED_BYTES {
        metrics::add(Metric::HostToDeviceBytes, bytes.len() as u64);
        return Ok(Arc::new(
            client.buffer_from_host(bytes, dtype, dims, device)?,
        ));
    }
    static CACHE: OnceLock<Mutex<HashMap<HostInputKey, Arc<Buffer>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (
        client.id(),
        device_index,
        dtype,
        dims.to_vec(),
        bytes.to_vec(),
    );
    if let Some(buffer) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(buffer.clone());
    }
    metrics::add(Metric::HostToDeviceBytes, bytes.len() as u64);
    let buffer = Arc::new(client.buffer_from_host(bytes, dtype, dims, device)?);
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() >= MAX_ENTRIES {
        // Values that change every step would grow the cache without bound.
        cache.clear();
    }
    cache.insert(key, buffer.clone());
    Ok(buffer)
}

/// Host bytes of a scalar converted to `dtype` (PyTorch's scalar casts).
fn scalar_bytes(literal: Literal, dtype: DType) -> Vec<u8> {
    let f = match literal {
        Literal::Float(x) => x,
        Literal::Int(x) => x as f64,
        Literal::Bool(x) => x as i64 as f64,
    };
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
