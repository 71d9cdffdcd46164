//! The graph an op's lowering builds.
//!
//! An op's lowering (in `ops`) describes its computation on a `Builder`: it
//! reads tensor arguments (strided views of storages become slices,
//! transposes, broadcasts or gathers of the storage's flat buffer), takes
//! scalar arguments as device inputs (so a changing learning rate does not
//! recompile), and either returns new tensors or writes into argument views
//! (a new version of the storage: update-slice or scatter). The builder only
//! builds: the engine runs what it built (eagerly, or recorded into a
//! pending or captured graph), so `ops` and `engine` never import each
//! other.

mod emit;
mod views;

use std::cell::Cell;
use std::sync::Arc;

use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{Graph, Node, TensorType, ValueId};
use crate::runtime::{Buffer, Client};
use crate::storage::{Storage, View};

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

/// Host values of an integer or bool tensor, row-major.
pub(crate) fn host_values(t: &TensorArg) -> Result<Vec<i64>> {
    let bytes = t.storage.read_view(&t.view)?;
    let chunk = |n: usize| bytes.chunks_exact(n);
    Ok(match t.view.dtype {
        DType::I64 => chunk(8)
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        DType::I32 => chunk(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap_or([0; 4])) as i64)
            .collect(),
        DType::I16 => chunk(2)
            .map(|c| i16::from_ne_bytes(c.try_into().unwrap_or([0; 2])) as i64)
            .collect(),
        DType::I8 => bytes.iter().map(|&v| v as i8 as i64).collect(),
        DType::U8 | DType::Bool => bytes.iter().map(|&v| v as i64).collect(),
        other => {
            return Err(Error::invalid(
                "index tensor",
                "an integer or bool tensor",
                other,
            ))
        }
    })
}

/// What feeds one graph parameter at execution time.
pub(crate) enum ParamSource {
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
pub(crate) struct StorageSlot {
    pub(crate) storage: Arc<Storage>,
    /// The flat value as stored (dtype of the storage's value).
    pub(crate) flat: ValueId,
    /// The graph parameter its value enters as; None when it reads as
    /// zeros (never written) or the op records it.
    pub(crate) param: Option<usize>,
    pub(crate) written: bool,
}

#[derive(Clone)]
pub(crate) enum PendingOutput {
    Alias(usize),
    New { value: ValueId, sizes: Dims },
    None,
}

/// Builds one op's graph. Ops use its typed helpers; every helper checks
/// shapes and dtypes so a mismatch is an error, not a bad program.
pub struct Builder<'a> {
    pub(crate) client: &'a Client,
    pub(crate) op: &'static str,
    args: &'a [Arg],
    pub(crate) graph: Graph,
    pub(crate) sources: Vec<ParamSource>,
    pub(crate) slots: Vec<StorageSlot>,
    pub(crate) outputs: Vec<PendingOutput>,
    pub(crate) device_index: Option<usize>,
    pub(crate) mode: Mode,
    /// Device-side checks (deferred mode): a bool flag that is true when
    /// the op's input was bad, and the error to raise then.
    pub(crate) checks: Vec<(ValueId, Error)>,
}

/// A builder's vectors, emptied, kept for the next builder on its thread.
#[derive(Default)]
struct Room {
    params: Vec<TensorType>,
    nodes: Vec<(Node, TensorType)>,
    sources: Vec<ParamSource>,
    slots: Vec<StorageSlot>,
    outputs: Vec<PendingOutput>,
    checks: Vec<(ValueId, Error)>,
}

thread_local! {
    static SPARE_ROOM: Cell<Option<Room>> = const { Cell::new(None) };
}

impl Drop for Builder<'_> {
    /// Keeps the vectors (those the engine did not take) for the next op.
    fn drop(&mut self) {
        let mut room = Room {
            params: std::mem::take(&mut self.graph.params),
            nodes: std::mem::take(&mut self.graph.nodes),
            sources: std::mem::take(&mut self.sources),
            slots: std::mem::take(&mut self.slots),
            outputs: std::mem::take(&mut self.outputs),
            checks: std::mem::take(&mut self.checks),
        };
        room.params.clear();
        room.nodes.clear();
        room.sources.clear();
        room.slots.clear();
        room.outputs.clear();
        room.checks.clear();
        // A thread that is exiting keeps nothing.
        let _ = SPARE_ROOM.try_with(|spare| spare.set(Some(room)));
    }
}

/// The execution mode: how the graph being built will run, which is what
/// its lowering may rely on (the engine's `mode` module switches it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Run as its own program as soon as it is built.
    Eager,
    /// Recorded into the device's pending graph.
    Deferred,
    /// Recorded into a graph being captured for replay.
    Capture,
}

impl<'a> Builder<'a> {
    /// A builder for one call of `op` on `args`. Refuses a tensor argument
    /// (lists included) whose view does not lie in its storage, or whose
    /// sizes have no contiguous strides in 64 bits, before any lowering
    /// computes with its sizes; reads and writes rely on this check.
    pub(crate) fn new(
        client: &'a Client,
        op: &'static str,
        args: &'a [Arg],
        mode: Mode,
    ) -> Result<Builder<'a>> {
        let tensors = args.iter().filter_map(|a| match a {
            Arg::Tensor(t) => Some(t),
            _ => None,
        });
        let in_lists = args
            .iter()
            .filter_map(|a| match a {
                Arg::TensorList(list) => Some(list.iter().flatten()),
                _ => None,
            })
            .flatten();
        let mut inputs = 0;
        for t in tensors.chain(in_lists) {
            t.view.check_within(t.storage.elements(t.view.dtype)?)?;
            inputs += 1;
        }
        // Room for what most ops make, so building one does not regrow its
        // vectors op after op: a parameter and a slot per tensor input (plus
        // scalar inputs), a few nodes per input. The vectors are the last
        // builder's on this thread (see `Drop`), so most ops allocate none.
        let params = inputs + 2;
        let mut b = Builder::prebuilt(client, op, args, mode, None);
        b.graph.params.reserve(params);
        b.graph.nodes.reserve(4 * params);
        b.sources.reserve(params);
        b.slots.reserve(inputs + 1);
        b.outputs.reserve(1);
        Ok(b)
    }

    /// An empty builder for `op` on `args`, with the last builder's vectors,
    /// that checks nothing: `new` checks the arguments first, and an
    /// earlier call's plan fills one in with its graph, sources, slots and
    /// outputs (that call's arguments, of the same views and storage
    /// sizes, were checked).
    pub(crate) fn prebuilt(
        client: &'a Client,
        op: &'static str,
        args: &'a [Arg],
        mode: Mode,
        device_index: Option<usize>,
    ) -> Builder<'a> {
        let room = SPARE_ROOM.with(Cell::take).unwrap_or_default();
        Builder {
            client,
            op,
            args,
            graph: Graph {
                params: room.params,
                nodes: room.nodes,
                ..Graph::default()
            },
            sources: room.sources,
            slots: room.slots,
            outputs: room.outputs,
            device_index,
            mode,
            checks: room.checks,
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

    pub(crate) fn args(&self) -> &'a [Arg] {
        self.args
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
}
