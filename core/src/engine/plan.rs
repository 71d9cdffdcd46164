//! Plans of ops. An op called again with arguments of the same kind
//! (tensors of the same storages' sizes, views and dtypes, the same scalar
//! values) builds the same graph, so its first call keeps what running it
//! takes. Eagerly: the executable, where each input comes from, and what
//! each output becomes; later calls check their arguments against that and
//! launch, without building the op's graph again, lowering it or looking
//! its program up (~5k of an eager elementwise op's ~36k instructions).
//! Recorded in a step (deferred mode): the op's graph, with the storages it
//! reads and writes as argument positions; later calls whose storages hold
//! the same kinds of values (a buffer, a pending value, never written) of
//! the same dtypes record a copy of it rebound to theirs, without lowering
//! the op again.
//!
//! A lowering whose graph depends on anything else is not planned: one that
//! read tensor values on the host (masks, indices, range checks), one with
//! a generator (its key changes every call), or one that read a storage
//! that was not a plain buffer.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rustc_hash::{FxHashMap, FxHashSet, FxHasher};

use super::{host_input, launch};
use crate::builder::{
    Arg, Builder, Mode, Output, ParamSource, PendingOutput, StorageSlot, TensorArg,
};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{Node, TensorType, ValueId};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client, LoadedExecutable};
use crate::storage::{self, Storage, StorageValue, View};

/// Plans kept (and keys seen once); all are dropped when this many more
/// would be kept (what repeats is planned again).
const MAX_PLANS: usize = 4096;

/// One tensor argument, as a plan is specialised on it.
struct TensorKey {
    /// The index of the first tensor of the call on the same storage.
    same_as: usize,
    device_index: usize,
    nbytes: usize,
    view: View,
    /// What its storage holds when recorded (deferred mode). None in eager
    /// plans, which check the buffer they launch with instead.
    recorded: Option<RecordedValue>,
}

/// What a recorded op's lowering sees of a storage's value: zeros (never
/// written: a constant of the graph), a buffer, or a value the pending
/// graph computes (lowerings may tell the two apart: a range check reads
/// a buffer on the host and checks a pending value on the device), each
/// with its dtype (another is read through a bitcast).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum RecordedValue {
    Zeros,
    Buffer(DType),
    Pending(DType),
}

/// What `storage` holds as a recorded op reads it; None for the values a
/// recording is not planned for (sharded, or lost to a failed graph).
fn recorded_value(storage: &Storage) -> Option<RecordedValue> {
    storage.with_recorded_value(|value| match value {
        StorageValue::Zeros => Some(RecordedValue::Zeros),
        StorageValue::Buffer { dtype, .. } => Some(RecordedValue::Buffer(*dtype)),
        StorageValue::Pending { dtype } => Some(RecordedValue::Pending(*dtype)),
        StorageValue::Sharded { .. } | StorageValue::Failed { .. } => None,
    })
}

/// One argument, as a plan is specialised on it.
enum ArgKey {
    None,
    Tensor(TensorKey),
    Int(i64),
    /// By its bits: -0.0 and NaN are values like any other.
    Float(u64),
    Bool(bool),
    IntList(Vec<i64>),
    FloatList(Vec<u64>),
    TensorList(Vec<Option<TensorKey>>),
    ScalarType(DType),
    Str(String),
    Device(i64),
}

/// Where an input of the executable comes from.
enum Input {
    /// The buffer of the call's tensor at this index (Tensor arguments and
    /// list elements, in order), which must hold a value of this dtype.
    Tensor(usize, DType),
    /// A host value that is the same on every call the plan matches (a
    /// scalar argument): uploaded as eager ops upload theirs, so a value
    /// that repeats has one buffer and one that does not leaves none.
    Host {
        bytes: Vec<u8>,
        dtype: DType,
        dims: Vec<i64>,
    },
}

/// What an output of the op becomes.
#[derive(Clone)]
pub(super) enum PlanOutput {
    Alias(usize),
    None,
    New { sizes: Dims, dtype: DType },
}

struct Plan {
    op: usize,
    client_id: usize,
    device_index: usize,
    args: Vec<ArgKey>,
    kind: PlanKind,
}

enum PlanKind {
    /// An eager call's: launch its executable.
    Launch {
        /// Held by the executable cache: a plan does not keep a program the
        /// cache evicted (past RTPU_MEMORY_CACHE_ENTRIES) alive.
        exe: Weak<LoadedExecutable>,
        inputs: Vec<Input>,
        outputs: Vec<PlanOutput>,
        /// The tensors whose storages the op writes (at their index in the
        /// call), in the order of the executable's outputs after the new
        /// ones, with the dtype of the value written.
        written: Vec<(usize, DType)>,
    },
    /// A recorded call's: record its graph again.
    Record(RecordedOp),
}

impl PlanKind {
    /// Whether the plan can still run: not when the memory cache evicted
    /// its program.
    fn live(&self) -> bool {
        match self {
            PlanKind::Launch { exe, .. } => exe.strong_count() > 0,
            PlanKind::Record(_) => true,
        }
    }
}

/// A recorded op's graph, its storages named by the position of a tensor
/// of the call on them (Tensor arguments and list elements, in order).
struct RecordedOp {
    params: Vec<TensorType>,
    nodes: Vec<(Node, TensorType)>,
    sources: Vec<RecordedSource>,
    slots: Vec<RecordedSlot>,
    outputs: Vec<PendingOutput>,
}

enum RecordedSource {
    /// The value of the storage of the call's tensor at this index, as the
    /// op first read it.
    Storage { tensor: usize, view: View },
    Host {
        bytes: Vec<u8>,
        dtype: DType,
        dims: Vec<i64>,
    },
}

struct RecordedSlot {
    tensor: usize,
    flat: ValueId,
    param: Option<usize>,
    written: bool,
}

/// The call's tensors in order: Tensor arguments and the elements of
/// tensor lists.
fn tensors(args: &[Arg]) -> Vec<&TensorArg> {
    let mut tensors = Vec::with_capacity(args.len());
    for arg in args {
        match arg {
            Arg::Tensor(t) => tensors.push(t),
            Arg::TensorList(list) => tensors.extend(list.iter().flatten()),
            _ => {}
        }
    }
    tensors
}

/// The index of the first of the call's tensors seen so far (`seen`) on
/// `storage`, or the next index when none is; records this one.
fn same_as(seen: &mut Vec<*const Storage>, storage: &Arc<Storage>) -> usize {
    let ptr = Arc::as_ptr(storage);
    let first = seen.iter().position(|&s| s == ptr).unwrap_or(seen.len());
    seen.push(ptr);
    first
}

/// The key of each argument of a call, with its storages' values when
/// `recorded`; None when one is of a kind no plan is made for (a
/// generator, a sharded or lost value).
fn keys(args: &[Arg], recorded: bool) -> Option<Vec<ArgKey>> {
    let mut seen = Vec::new();
    let mut tensor_key = |t: &TensorArg| {
        Some(TensorKey {
            same_as: same_as(&mut seen, &t.storage),
            device_index: t.storage.device_index(),
            nbytes: t.storage.nbytes(),
            view: t.view.clone(),
            recorded: match recorded {
                true => Some(recorded_value(&t.storage)?),
                false => None,
            },
        })
    };
    args.iter()
        .map(|a| {
            Some(match a {
                Arg::None => ArgKey::None,
                Arg::Tensor(t) => ArgKey::Tensor(tensor_key(t)?),
                Arg::Int(v) => ArgKey::Int(*v),
                Arg::Float(v) => ArgKey::Float(v.to_bits()),
                Arg::Bool(v) => ArgKey::Bool(*v),
                Arg::IntList(v) => ArgKey::IntList(v.clone()),
                Arg::FloatList(v) => ArgKey::FloatList(v.iter().map(|f| f.to_bits()).collect()),
                Arg::TensorList(list) => {
                    let mut keys = Vec::with_capacity(list.len());
                    for t in list {
                        keys.push(match t {
                            Some(t) => Some(tensor_key(t)?),
                            None => None,
                        });
                    }
                    ArgKey::TensorList(keys)
                }
                Arg::ScalarType(d) => ArgKey::ScalarType(*d),
                Arg::Str(s) => ArgKey::Str(s.clone()),
                Arg::Device(d) => ArgKey::Device(*d),
                Arg::Generator { .. } => return None,
            })
        })
        .collect()
}

/// Whether the call's arguments are those `plan` was made for.
fn matches(plan: &Plan, args: &[Arg]) -> bool {
    if plan.args.len() != args.len() {
        return false;
    }
    let mut seen = Vec::new();
    let mut tensor_matches = |key: &TensorKey, t: &TensorArg| {
        key.same_as == same_as(&mut seen, &t.storage)
            && key.view == t.view
            && key.nbytes == t.storage.nbytes()
            && key.device_index == t.storage.device_index()
            && key
                .recorded
                .is_none_or(|value| recorded_value(&t.storage) == Some(value))
    };
    plan.args
        .iter()
        .zip(args)
        .all(|(key, arg)| match (key, arg) {
            (ArgKey::None, Arg::None) => true,
            (ArgKey::Tensor(k), Arg::Tensor(t)) => tensor_matches(k, t),
            (ArgKey::Int(k), Arg::Int(v)) => k == v,
            (ArgKey::Float(k), Arg::Float(v)) => *k == v.to_bits(),
            (ArgKey::Bool(k), Arg::Bool(v)) => k == v,
            (ArgKey::IntList(k), Arg::IntList(v)) => k == v,
            (ArgKey::FloatList(k), Arg::FloatList(v)) => {
                k.len() == v.len() && k.iter().zip(v).all(|(k, v)| *k == v.to_bits())
            }
            (ArgKey::TensorList(k), Arg::TensorList(list)) => {
                k.len() == list.len()
                    && k.iter().zip(list).all(|(k, t)| match (k, t) {
                        (Some(k), Some(t)) => tensor_matches(k, t),
                        (None, None) => true,
                        _ => false,
                    })
            }
            (ArgKey::ScalarType(k), Arg::ScalarType(d)) => k == d,
            (ArgKey::Str(k), Arg::Str(s)) => k == s,
            (ArgKey::Device(k), Arg::Device(d)) => k == d,
            _ => false,
        })
}

/// What plans are looked up by: the op, the client, whether the call is
/// recorded, and the arguments' kinds, shapes and scalar values (and their
/// storages' values when recorded). Calls with equal keys hash alike. None
/// when a recorded call reads a value no plan is made for.
fn hash_of(op: usize, client: &Client, args: &[Arg], recorded: bool) -> Option<u64> {
    let mut h = FxHasher::default();
    (op, client.id(), recorded, args.len()).hash(&mut h);
    let hash_tensor = |h: &mut FxHasher, t: &TensorArg| -> Option<()> {
        (t.storage.nbytes(), t.storage.device_index()).hash(h);
        t.view.hash(h);
        if recorded {
            recorded_value(&t.storage)?.hash(h);
        }
        Some(())
    };
    for arg in args {
        std::mem::discriminant(arg).hash(&mut h);
        match arg {
            Arg::Tensor(t) => hash_tensor(&mut h, t)?,
            Arg::Int(v) | Arg::Device(v) => v.hash(&mut h),
            Arg::Float(v) => v.to_bits().hash(&mut h),
            Arg::Bool(v) => v.hash(&mut h),
            Arg::IntList(v) => v.hash(&mut h),
            Arg::TensorList(list) => {
                for t in list {
                    match t {
                        Some(t) => hash_tensor(&mut h, t)?,
                        None => 0u8.hash(&mut h),
                    }
                }
            }
            Arg::ScalarType(d) => d.hash(&mut h),
            Arg::Str(s) => s.hash(&mut h),
            Arg::None | Arg::FloatList(_) | Arg::Generator { .. } => {}
        }
    }
    Some(h.finish())
}

#[derive(Default)]
struct Plans {
    by_hash: FxHashMap<u64, Vec<Arc<Plan>>>,
    count: usize,
    /// Keys of calls seen once (emptied when full: what repeats comes back).
    seen: FxHashSet<u64>,
}

fn plans() -> std::sync::MutexGuard<'static, Plans> {
    static PLANS: OnceLock<Mutex<Plans>> = OnceLock::new();
    super::global(&PLANS)
}

/// The plan made for calls like `site`'s on `args`, if any.
fn find(site: &Site, client: &Client, args: &[Arg]) -> Option<Arc<Plan>> {
    let hash = site.key_hash?;
    let plans = plans();
    plans
        .by_hash
        .get(&hash)?
        .iter()
        .find(|p| p.op == site.op && p.client_id == client.id() && matches(p, args))
        .cloned()
}

/// Runs the eager call `site` (op `site.op` on `args`) by an earlier
/// call's plan; None outside eager mode, when no plan matches the call, or
/// when a storage it reads holds no plain buffer now (the caller then
/// builds the op).
pub(super) fn replay(site: &Site, client: &Client, args: &[Arg]) -> Result<Option<Vec<Output>>> {
    if site.mode != Mode::Eager {
        return Ok(None);
    }
    let Some(plan) = find(site, client, args) else {
        return Ok(None);
    };
    let PlanKind::Launch {
        exe,
        inputs: planned_inputs,
        outputs,
        written,
    } = &plan.kind
    else {
        return Ok(None);
    };
    let Some(exe) = exe.upgrade() else {
        return Ok(None);
    };
    let device = client.device(plan.device_index)?;
    let tensors = tensors(args);
    let mut inputs = Vec::with_capacity(planned_inputs.len());
    for input in planned_inputs {
        inputs.push(match input {
            Input::Tensor(i, dtype) => {
                let storage = &tensors[*i].storage;
                if storage.client().id() != client.id() {
                    return Ok(None);
                }
                match storage.value()? {
                    StorageValue::Buffer { buffer, dtype: d } if d == *dtype => buffer,
                    _ => return Ok(None),
                }
            }
            Input::Host { bytes, dtype, dims } => {
                host_input(client, plan.device_index, &device, bytes, *dtype, dims)?
            }
        });
    }
    metrics::add(Metric::CacheHits, 1);
    metrics::add(Metric::OpsReplayed, 1);
    let results = launch::launch(client, plan.device_index, &exe, &inputs, &[])?;
    let written = written
        .iter()
        .map(|&(i, dtype)| (&tensors[i].storage, dtype));
    install_results(client, plan.device_index, outputs, written, results).map(Some)
}

/// The builder of the recorded call `site` (op `op_name` on `args`) made
/// from an earlier call's plan: its graph with this call's storages; None
/// outside deferred mode or when no plan matches the call (the caller then
/// lowers the op).
pub(super) fn rebuild<'a>(
    site: &Site,
    client: &'a Client,
    op_name: &'static str,
    args: &'a [Arg],
) -> Option<Builder<'a>> {
    if site.mode != Mode::Deferred {
        return None;
    }
    let plan = find(site, client, args)?;
    let PlanKind::Record(recorded) = &plan.kind else {
        return None;
    };
    let tensors = tensors(args);
    // A storage of another runtime is refused by the lowering.
    if tensors
        .iter()
        .any(|t| t.storage.client().id() != client.id())
    {
        return None;
    }
    let mut b = Builder::prebuilt(client, op_name, args, site.mode, Some(plan.device_index));
    b.graph.params.extend_from_slice(&recorded.params);
    b.graph.nodes.extend_from_slice(&recorded.nodes);
    b.sources
        .extend(recorded.sources.iter().map(|source| match source {
            RecordedSource::Storage { tensor, view } => ParamSource::Recorded {
                storage: tensors[*tensor].storage.clone(),
                view: view.clone(),
            },
            RecordedSource::Host { bytes, dtype, dims } => ParamSource::Host {
                bytes: bytes.clone(),
                dtype: *dtype,
                dims: dims.clone(),
            },
        }));
    b.slots
        .extend(recorded.slots.iter().map(|slot| StorageSlot {
            storage: tensors[slot.tensor].storage.clone(),
            flat: slot.flat,
            param: slot.param,
            written: slot.written,
        }));
    b.outputs.extend_from_slice(&recorded.outputs);
    metrics::add(Metric::OpsRecordedByPlan, 1);
    Some(b)
}

/// What each output of the op `b` built becomes.
pub(super) fn output_template(b: &Builder) -> Vec<PlanOutput> {
    b.outputs
        .iter()
        .map(|o| match o {
            PendingOutput::Alias(i) => PlanOutput::Alias(*i),
            PendingOutput::None => PlanOutput::None,
            PendingOutput::New { value, sizes } => PlanOutput::New {
                sizes: sizes.clone(),
                dtype: b.graph.ty(*value).dtype,
            },
        })
        .collect()
}

/// The op's outputs from its program's `results` on `device_index`: a new
/// tensor for each new output of `template`, in order, then the next value
/// of each storage `written` (with the dtype written).
pub(super) fn install_results<'a>(
    client: &Client,
    device_index: usize,
    template: &[PlanOutput],
    written: impl IntoIterator<Item = (&'a Arc<Storage>, DType)>,
    results: Vec<Buffer>,
) -> Result<Vec<Output>> {
    let mut results = results.into_iter();
    let mut next = || {
        results.next().ok_or_else(|| {
            Error::invalid(
                "program outputs",
                "one per output and written storage",
                "fewer",
            )
        })
    };
    let mut outputs = Vec::with_capacity(template.len());
    for out in template {
        outputs.push(match out {
            PlanOutput::Alias(i) => Output::Alias(*i),
            PlanOutput::None => Output::None,
            PlanOutput::New { sizes, dtype } => Output::New {
                storage: Storage::from_buffer(client, device_index, next()?, *dtype)?,
                view: View::contiguous(sizes, *dtype),
            },
        });
    }
    for (storage, dtype) in written {
        storage.set_value(next()?, dtype)?;
    }
    Ok(outputs)
}

/// A call of an op: which op in which mode, the hash of its key when
/// eager or recorded (what plans are looked up and kept by), and the host
/// reads before it (a build that read tensor values on the host is not
/// planned).
pub(super) struct Site {
    op: usize,
    mode: Mode,
    key_hash: Option<u64>,
    host_reads: u64,
}

impl Site {
    pub(super) fn new(client: &Client, op: usize, args: &[Arg], mode: Mode) -> Site {
        let key_hash = match mode {
            Mode::Eager => hash_of(op, client, args, false),
            Mode::Deferred => hash_of(op, client, args, true),
            Mode::Capture => None,
        };
        Site {
            op,
            mode,
            key_hash,
            host_reads: storage::host_reads(),
        }
    }
}

/// The hash a plan of the call `site` built as `b` is kept by, when one
/// is to be made now: the build read no tensor values on the host and
/// checks nothing on the device, and the same key was seen before (what
/// is called once, a scalar never seen before, costs no plan).
fn plannable(site: &Site, b: &Builder) -> Option<u64> {
    if storage::host_reads() != site.host_reads || !b.checks.is_empty() {
        return None;
    }
    let hash = site.key_hash?;
    let mut plans = plans();
    if plans.seen.len() >= MAX_PLANS {
        plans.seen.clear();
    }
    match plans.seen.insert(hash) {
        true => None,
        false => Some(hash),
    }
}

/// Keeps the plan of kind `kind` made from the call `site` built as `b`,
/// whose arguments' key is `args` and hashes to `hash`.
fn keep(hash: u64, site: &Site, b: &Builder, args: Vec<ArgKey>, kind: PlanKind) {
    let plan = Plan {
        op: site.op,
        client_id: b.client.id(),
        device_index: b.device_index.unwrap_or(0),
        args,
        kind,
    };
    let mut plans = plans();
    if plans.count >= MAX_PLANS {
        plans.by_hash.clear();
        plans.count = 0;
    }
    // A plan whose program the cache evicted gives way to this one.
    let candidates = plans.by_hash.entry(hash).or_default();
    let before = candidates.len();
    candidates.retain(|p| p.kind.live());
    let evicted = before - candidates.len();
    candidates.push(Arc::new(plan));
    plans.count = plans.count + 1 - evicted;
}

/// Keeps the plan of an eager call whose built op `b` runs `exe`, makes
/// the outputs `template` and writes the storages of its slots `written`,
/// when later calls can reuse it (`plannable`).
pub(super) fn remember(
    site: &Site,
    b: &Builder,
    exe: &Arc<LoadedExecutable>,
    template: &[PlanOutput],
    written: &[usize],
) {
    let Some(hash) = plannable(site, b) else {
        return;
    };
    let Some(keys) = keys(b.args(), false) else {
        return;
    };
    let tensors = tensors(b.args());
    let index_of = |s: &Arc<Storage>| tensors.iter().position(|t| Arc::ptr_eq(&t.storage, s));
    let mut inputs: Vec<Option<Input>> = b
        .sources
        .iter()
        .map(|source| match source {
            ParamSource::Host { bytes, dtype, dims } => Some(Input::Host {
                bytes: bytes.clone(),
                dtype: *dtype,
                dims: dims.clone(),
            }),
            _ => None,
        })
        .collect();
    for slot in &b.slots {
        // A storage read as zeros (never written) is a constant of the
        // graph: a later call may find it written.
        let (Some(p), Some(i)) = (slot.param, index_of(&slot.storage)) else {
            return;
        };
        inputs[p] = Some(Input::Tensor(i, b.graph.params[p].dtype));
    }
    let Some(inputs) = inputs.into_iter().collect::<Option<Vec<_>>>() else {
        return;
    };
    let mut planned_written = Vec::with_capacity(written.len());
    for &s in written {
        let slot = &b.slots[s];
        let Some(i) = index_of(&slot.storage) else {
            return;
        };
        planned_written.push((i, b.graph.ty(slot.flat).dtype));
    }
    let kind = PlanKind::Launch {
        exe: Arc::downgrade(exe),
        inputs,
        outputs: template.to_vec(),
        written: planned_written,
    };
    keep(hash, site, b, keys, kind);
}

/// Keeps the plan of a recorded call built as `b` (before it is recorded)
/// when later calls can reuse it (`plannable`): its graph, each storage it
/// reads or writes named by a tensor of the call on it. What each storage
/// holds (`RecordedValue`) is part of the key, so a reused graph reads
/// each as this one did.
pub(super) fn remember_recorded(site: &Site, b: &Builder) {
    let Some(hash) = plannable(site, b) else {
        return;
    };
    let Some(keys) = keys(b.args(), true) else {
        return;
    };
    let tensors = tensors(b.args());
    let index_of = |s: &Arc<Storage>| tensors.iter().position(|t| Arc::ptr_eq(&t.storage, s));
    let mut sources = Vec::with_capacity(b.sources.len());
    for source in &b.sources {
        sources.push(match source {
            ParamSource::Recorded { storage, view } => {
                let Some(tensor) = index_of(storage) else {
                    return;
                };
                RecordedSource::Storage {
                    tensor,
                    view: view.clone(),
                }
            }
            ParamSource::Host { bytes, dtype, dims } => RecordedSource::Host {
                bytes: bytes.clone(),
                dtype: *dtype,
                dims: dims.clone(),
            },
            // An eager op's input; not made in deferred mode.
            ParamSource::Storage(_) => return,
        });
    }
    let mut slots = Vec::with_capacity(b.slots.len());
    for slot in &b.slots {
        let Some(tensor) = index_of(&slot.storage) else {
            return;
        };
        slots.push(RecordedSlot {
            tensor,
            flat: slot.flat,
            param: slot.param,
            written: slot.written,
        });
    }
    let recorded = RecordedOp {
        params: b.graph.params.clone(),
        nodes: b.graph.nodes.clone(),
        sources,
        slots,
        outputs: b.outputs.clone(),
    };
    keep(hash, site, b, keys, PlanKind::Record(recorded));
}
