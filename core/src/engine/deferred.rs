//! Deferred execution: in deferred mode ops are recorded into one pending
//! graph per device, which runs as one XLA program when it is flushed: at the
//! end of `rtpu.step()`, at `rtpu.sync()`, when a host read needs a pending
//! value, or past a size limit.
//!
//! A storage written by a recorded op holds `StorageValue::Pending`; the
//! graph keeps its current value. At a flush only storages that are still
//! alive become outputs, so intermediates freed during the step cost nothing,
//! and the buffers of storages the graph overwrites are donated to it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use rustc_hash::FxHashMap;

use super::cache::{self, ReadAs, ReadFrom};
use super::capture::RanGraph;
use super::checks::{
    keep_old_values_on_failure, read_kept_values, verify_checks, watch_checks, OnFailure, Ran,
};
use super::failure::{find_culprit, graph_error};
use super::launch::{execute, Source};
use super::location::{current_location, intern_location};
use super::mode::{self, Mode};
use super::spmd::{self, Computed};
use super::work;
use crate::builder::{Builder, Output, ParamSource, PendingOutput};
use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};
use crate::ir::{Donor, Graph, Node, TensorType, ValueId};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client};
use crate::storage::{Storage, StorageValue, View};

/// A pending graph past this many nodes is flushed where it stands, so a
/// program that never reaches a sync point still runs in bounded pieces.
const MAX_PENDING_NODES: usize = 1 << 18;

/// Switches between eager and deferred execution. Leaving deferred mode
/// runs every pending graph (its error, if any, is returned; the mode is
/// eager either way). Refused during a capture.
pub fn set_deferred(deferred: bool) -> Result<()> {
    let target = if deferred {
        Mode::Deferred
    } else {
        Mode::Eager
    };
    match mode::current() {
        Mode::Capture => Err(Error::invalid(
            "the execution mode",
            "no change while a graph is being captured",
            format!("a switch to {target:?}"),
        )),
        Mode::Deferred if !deferred => {
            mode::enter(Mode::Eager);
            flush_all(None)
        }
        _ => {
            mode::enter(target);
            Ok(())
        }
    }
}

// ----- the pending graphs -----------------------------------------------

/// One recorded op: what explanations and errors name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordedOp {
    pub name: &'static str,
    pub location: u32,
}

/// A storage the pending graph reads or writes.
struct Slot {
    /// Weak, so the graph does not keep freed tensors alive; it also keeps
    /// the allocation, so the address key below is never reused meanwhile.
    storage: Weak<Storage>,
    /// The storage's current value in the graph (flat).
    value: ValueId,
    /// The parameter that read the storage's buffer, if it was read.
    param: Option<usize>,
    /// The value before the graph, for a storage written without being read
    /// (restored if the graph fails).
    before: Option<StorageValue>,
    written: bool,
}

struct PendingGraph {
    client: Client,
    device_index: usize,
    graph: Graph,
    sources: Vec<Source>,
    /// The recorded op that introduced each parameter, and what it read
    /// ("float32[8, 32]"), for explanations.
    param_op: Vec<(usize, ReadAs)>,
    slots: Vec<Slot>,
    slot_of: FxHashMap<usize, usize>,
    ops: Vec<RecordedOp>,
    /// The node count after each recorded op: op `i` made nodes
    /// `op_ends[i - 1]..op_ends[i]`.
    op_ends: Vec<usize>,
    /// Device-side input checks: a bool flag, its error (code, message),
    /// the op's index.
    checks: Vec<(ValueId, (ErrorCode, String), usize)>,
}

fn pending() -> MutexGuard<'static, Vec<PendingGraph>> {
    static PENDING: OnceLock<Mutex<Vec<PendingGraph>>> = OnceLock::new();
    super::global(&PENDING)
}

fn storage_key(storage: &Arc<Storage>) -> usize {
    Arc::as_ptr(storage) as usize
}

/// The node, storage, parameter and op counts of the last graph that ran: a
/// training loop records the same graph each step, so the next starts with
/// room instead of regrowing.
static LAST_GRAPH_NODES: AtomicUsize = AtomicUsize::new(0);
static LAST_GRAPH_SLOTS: AtomicUsize = AtomicUsize::new(0);
static LAST_GRAPH_PARAMS: AtomicUsize = AtomicUsize::new(0);
static LAST_GRAPH_OPS: AtomicUsize = AtomicUsize::new(0);

impl PendingGraph {
    fn new(client: &Client, device_index: usize) -> PendingGraph {
        let slots = LAST_GRAPH_SLOTS.load(Ordering::Relaxed);
        let params = LAST_GRAPH_PARAMS.load(Ordering::Relaxed);
        let ops = LAST_GRAPH_OPS.load(Ordering::Relaxed);
        PendingGraph {
            client: client.clone(),
            device_index,
            graph: Graph {
                params: Vec::with_capacity(params),
                nodes: Vec::with_capacity(LAST_GRAPH_NODES.load(Ordering::Relaxed)),
                ..Graph::default()
            },
            sources: Vec::with_capacity(params),
            param_op: Vec::with_capacity(params),
            slots: Vec::with_capacity(slots),
            slot_of: FxHashMap::with_capacity_and_hasher(slots, Default::default()),
            ops: Vec::with_capacity(ops),
            op_ends: Vec::with_capacity(ops),
            checks: Vec::new(),
        }
    }

    fn push(&mut self, node: Node, ty: TensorType) -> ValueId {
        self.graph.nodes.push((node, ty));
        self.graph.nodes.len() - 1
    }

    fn add_param(&mut self, ty: TensorType, source: Source, read_as: ReadAs) -> (usize, ValueId) {
        let index = self.graph.params.len();
        self.graph.params.push(ty.clone());
        self.sources.push(source);
        self.param_op.push((self.ops.len(), read_as));
        (index, self.push(Node::Param(index), ty))
    }

    /// The storage's value in the graph: its current graph value if the
    /// graph has one, else a new parameter reading its buffer (returned in
    /// `first_reads` to be committed with the op).
    fn read_storage(
        &mut self,
        storage: &Arc<Storage>,
        view: &View,
        ty: &TensorType,
        first_reads: &mut Vec<(Arc<Storage>, usize, ValueId)>,
    ) -> Result<ValueId> {
        let current = storage.recorded_value();
        if let Some(&slot) = self.slot_of.get(&storage_key(storage)) {
            let slot = &self.slots[slot];
            // A read-only slot is stale once the storage got another buffer
            // (a host write replaced it): that needs a new parameter.
            let fresh = slot.written
                || match (slot.param, &current) {
                    (Some(p), StorageValue::Buffer { buffer, .. }) => {
                        matches!(&self.sources[p], Source::Buffer(b) if Arc::ptr_eq(b, buffer))
                    }
                    (Some(p), StorageValue::Sharded { shards, .. }) => {
                        matches!(&self.sources[p], Source::Sharded(s) if Arc::ptr_eq(s, shards))
                    }
                    _ => false,
                };
            if fresh {
                if self.graph.ty(slot.value) != ty {
                    return Err(Error::invalid(
                        "a storage's value in the pending graph",
                        ty.to_string(),
                        self.graph.ty(slot.value).to_string(),
                    ));
                }
                return Ok(slot.value);
            }
        }
        match current {
            StorageValue::Buffer { buffer, .. } => {
                let read_as = ReadAs::of(view, ReadFrom::Storage);
                let (param, value) = self.add_param(ty.clone(), Source::Buffer(buffer), read_as);
                first_reads.push((storage.clone(), param, value));
                Ok(value)
            }
            StorageValue::Sharded { shards, .. } => {
                let read_as = ReadAs::of(view, ReadFrom::Sharded);
                let (param, value) = self.add_param(ty.clone(), Source::Sharded(shards), read_as);
                first_reads.push((storage.clone(), param, value));
                Ok(value)
            }
            StorageValue::Failed { code, message } => Err(Error::LostValue { code, message }),
            other => Err(Error::invalid(
                "a storage read by a recorded op",
                "a device buffer or a value in the pending graph",
                match other {
                    StorageValue::Zeros => "a never-written storage",
                    _ => "a pending value in no graph",
                },
            )),
        }
    }

    fn slot_for(&mut self, storage: &Arc<Storage>, value: ValueId) -> &mut Slot {
        let key = storage_key(storage);
        let index = match self.slot_of.get(&key) {
            Some(&i) => i,
            None => {
                self.slots.push(Slot {
                    storage: Arc::downgrade(storage),
                    value,
                    param: None,
                    before: None,
                    written: false,
                });
                self.slot_of.insert(key, self.slots.len() - 1);
                self.slots.len() - 1
            }
        };
        &mut self.slots[index]
    }

    /// Makes `value` the storage's value: it becomes pending.
    fn write_storage(&mut self, storage: &Arc<Storage>, value: ValueId) {
        let dtype = self.graph.ty(value).dtype;
        let previous = storage.recorded_value();
        let slot = self.slot_for(storage, value);
        if !slot.written && slot.param.is_none() {
            slot.before = Some(previous);
        }
        slot.value = value;
        slot.written = true;
        storage.set_recorded(StorageValue::Pending { dtype });
    }
}

/// What feeds a parameter of a graph spliced into a pending one.
pub(super) enum SplicedParam {
    /// The value of a storage (pending or not), read through `view`.
    Storage {
        storage: Arc<Storage>,
        view: View,
    },
    Buffer(Arc<Buffer>),
    Host {
        bytes: Vec<u8>,
        dtype: DType,
        dims: Vec<i64>,
    },
}

/// The index in `all` of the device's pending graph, made if there is none.
fn graph_for(all: &mut Vec<PendingGraph>, client: &Client, device_index: usize) -> usize {
    find_graph(all, client, device_index).unwrap_or_else(|| {
        all.push(PendingGraph::new(client, device_index));
        all.len() - 1
    })
}

fn find_graph(all: &[PendingGraph], client: &Client, device_index: usize) -> Option<usize> {
    all.iter()
        .position(|g| g.client.id() == client.id() && g.device_index == device_index)
}

impl PendingGraph {
    /// Copies `nodes` in, each parameter resolved through `params` to the
    /// value it stands for here, and returns every node's new id. On error
    /// nothing of them stays.
    fn splice(
        &mut self,
        nodes: impl IntoIterator<Item = (Node, TensorType)>,
        params: Vec<SplicedParam>,
        what: &str,
    ) -> Result<Vec<ValueId>> {
        let (nodes_before, params_before) = (self.graph.nodes.len(), self.graph.params.len());
        let mut params: Vec<Option<SplicedParam>> = params.into_iter().map(Some).collect();
        let nodes = nodes.into_iter();
        let mut remap: Vec<ValueId> = Vec::with_capacity(nodes.size_hint().0);
        let mut first_reads = Vec::new();
        let mut failure = None;
        for (mut node, ty) in nodes {
            let id = match node {
                Node::Param(i) => match params.get_mut(i).and_then(Option::take) {
                    Some(SplicedParam::Storage { storage, view }) => {
                        match self.read_storage(&storage, &view, &ty, &mut first_reads) {
                            Ok(v) => v,
                            Err(e) => {
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                    Some(SplicedParam::Buffer(buffer)) => {
                        let read_as = ReadAs::of_type(&ty, ReadFrom::Storage);
                        self.add_param(ty, Source::Buffer(buffer), read_as).1
                    }
                    Some(SplicedParam::Host { bytes, dtype, dims }) => {
                        let read_as = ReadAs::of_type(&ty, ReadFrom::Host);
                        self.add_param(ty, Source::Host { bytes, dtype, dims }, read_as)
                            .1
                    }
                    None => {
                        failure = Some(Error::invalid(
                            format!("{what}: parameter {i}"),
                            "one binding per parameter",
                            "a repeated or missing one",
                        ));
                        break;
                    }
                },
                _ => {
                    node.for_each_operand_mut(|v| *v = remap[*v]);
                    self.push(node, ty)
                }
            };
            remap.push(id);
        }
        if let Some(error) = failure {
            self.graph.nodes.truncate(nodes_before);
            self.graph.params.truncate(params_before);
            self.sources.truncate(params_before);
            self.param_op.truncate(params_before);
            return Err(error);
        }
        for (storage, param, value) in first_reads {
            let slot = self.slot_for(&storage, value);
            slot.value = value;
            slot.param = Some(param);
        }
        Ok(remap)
    }

    /// A new storage whose value is `value`.
    fn new_storage(&mut self, value: ValueId) -> Result<Arc<Storage>> {
        let ty = self.graph.ty(value).clone();
        let nbytes = ty.numel() as usize * ty.dtype.size_in_bytes();
        let storage = Storage::pending(&self.client, self.device_index, nbytes, ty.dtype)?;
        self.write_storage(&storage, value);
        Ok(storage)
    }

    /// Ends the op being recorded.
    fn finish_op(&mut self, name: &'static str) {
        self.ops.push(RecordedOp {
            name,
            location: current_location(),
        });
        self.op_ends.push(self.graph.nodes.len());
        metrics::add(Metric::OpsRecorded, 1);
    }
}

/// Records a built op into its device's pending graph and returns its
/// outputs, whose new storages are pending.
pub(super) fn record(mut builder: Builder<'_>, device_index: usize) -> Result<Vec<Output>> {
    let (client, op) = (builder.client, builder.op);
    let params = builder
        .sources
        .drain(..)
        .map(|source| match source {
            ParamSource::Recorded { storage, view } => SplicedParam::Storage { storage, view },
            ParamSource::Storage(buffer) => SplicedParam::Buffer(buffer),
            ParamSource::Host { bytes, dtype, dims } => SplicedParam::Host { bytes, dtype, dims },
        })
        .collect();
    let mut all = pending();
    let index = graph_for(&mut all, client, device_index);
    let pg = &mut all[index];
    // Drained, not moved: the builder keeps its vectors for the next op.
    let remap = pg.splice(builder.graph.nodes.drain(..), params, op)?;
    for slot in builder.slots.iter().filter(|s| s.written) {
        pg.write_storage(&slot.storage, remap[slot.flat]);
    }
    let mut results = Vec::with_capacity(builder.outputs.len());
    for out in builder.outputs.drain(..) {
        results.push(match out {
            PendingOutput::Alias(i) => Output::Alias(i),
            PendingOutput::None => Output::None,
            PendingOutput::New { value, sizes } => {
                let storage = pg.new_storage(remap[value])?;
                let dtype = pg.graph.ty(remap[value]).dtype;
                Output::New {
                    storage,
                    view: View::contiguous(&sizes, dtype),
                }
            }
        });
    }
    for (flag, error) in builder.checks.drain(..) {
        pg.checks
            .push((remap[flag], (error.code(), error.to_string()), pg.ops.len()));
    }
    pg.finish_op(op);
    if pg.graph.nodes.len() > MAX_PENDING_NODES {
        let pg = all.swap_remove(index);
        run(pg, intern_location("the pending-graph size limit"))?;
    }
    Ok(results)
}

/// Runs one device's pending graph for a capture (see `run_graph`).
pub(super) fn run_for_capture(
    client: &Client,
    device_index: usize,
    site: u32,
) -> Result<Option<RanGraph>> {
    let mut all = pending();
    let Some(index) = find_graph(&all, client, device_index) else {
        return Ok(None);
    };
    let pg = all.swap_remove(index);
    run_graph(pg, site, true)
}

/// Where an output of a captured graph recorded into a pending one goes.
pub(super) enum CapturedOutput {
    /// The new value of this storage.
    Into(Arc<Storage>),
    /// A new storage (returned to the caller).
    New,
    /// A device-side check flag and its error.
    Check((ErrorCode, String)),
    /// Nothing keeps it.
    Dropped,
}

/// Records a captured graph (`graph`, its parameters and outputs bound as
/// given) into the device's pending graph, as one op named `name`, so
/// compiled graphs called inside a step fuse with the rest of the step.
/// Returns the new storage of each `CapturedOutput::New`, in order.
pub(super) fn record_captured(
    client: &Client,
    device_index: usize,
    graph: &Graph,
    params: Vec<SplicedParam>,
    outputs: Vec<CapturedOutput>,
    name: &'static str,
) -> Result<Vec<Arc<Storage>>> {
    if outputs.len() != graph.outputs.len() {
        return Err(Error::invalid(
            format!("{name}: outputs"),
            graph.outputs.len(),
            outputs.len(),
        ));
    }
    let mut all = pending();
    let index = graph_for(&mut all, client, device_index);
    let pg = &mut all[index];
    let remap = pg.splice(graph.nodes.iter().cloned(), params, name)?;
    let op = pg.ops.len();
    let mut created = Vec::new();
    for (output, &value) in outputs.into_iter().zip(&graph.outputs) {
        let value = remap[value];
        match output {
            CapturedOutput::Into(storage) => pg.write_storage(&storage, value),
            CapturedOutput::New => created.push(pg.new_storage(value)?),
            CapturedOutput::Check(error) => pg.checks.push((value, error, op)),
            CapturedOutput::Dropped => {}
        }
    }
    pg.finish_op(name);
    Ok(created)
}

/// Runs the pending graph of one device, if it has one.
pub fn flush_device(client: &Client, device_index: usize) -> Result<()> {
    // Held while the graph runs, so no op records into a graph half-taken.
    let mut all = pending();
    let Some(index) = find_graph(&all, client, device_index) else {
        return Ok(());
    };
    let pg = all.swap_remove(index);
    run(pg, current_location())
}

/// Runs every pending graph. `site` names where the flush was asked for
/// (the `rtpu.step()` or `rtpu.sync()` line); recompiles are explained per
/// site.
pub fn flush_all(site: Option<&str>) -> Result<()> {
    let site = site.map_or_else(current_location, intern_location);
    let mut all = pending();
    let mut first_error = None;
    for pg in std::mem::take(&mut *all) {
        if let Err(e) = run(pg, site) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Runs every pending graph before a collective that cannot be part of a
/// program (one staged through the host, across processes): a step's
/// program ends there, and the ops after it record into the next one.
/// Counts one `collective_splits` when a graph was pending.
pub fn split_at_collective() -> Result<()> {
    if !pending().is_empty() {
        metrics::add(Metric::CollectiveSplits, 1);
    }
    flush_all(None)
}

/// Flushes every pending graph and waits until the devices have run
/// everything launched.
pub fn synchronize() -> Result<()> {
    flush_all(None)?;
    let start = Instant::now();
    work::wait_all()?;
    metrics::add_elapsed(Metric::WaitNs, start);
    verify_checks()
}

/// Compiles (or finds) and runs one pending graph, and installs its outputs
/// in the storages that are still alive. A capture donates nothing (the
/// capture keeps its sources; its replays donate) and returns what ran.
fn run(pg: PendingGraph, site: u32) -> Result<()> {
    super::capture::note_flush(site);
    run_graph(pg, site, false).map(|_| ())
}

fn run_graph(mut pg: PendingGraph, site: u32, capture: bool) -> Result<Option<RanGraph>> {
    LAST_GRAPH_NODES.store(pg.graph.nodes.len(), Ordering::Relaxed);
    LAST_GRAPH_SLOTS.store(pg.slots.len(), Ordering::Relaxed);
    LAST_GRAPH_PARAMS.store(pg.graph.params.len(), Ordering::Relaxed);
    LAST_GRAPH_OPS.store(pg.ops.len(), Ordering::Relaxed);
    // A captured graph takes an upstream flag (see `checks`) as its last
    // parameter, so its replays need not wait for earlier graphs' checks;
    // this run reads a false one. An SPMD program does not: its replays
    // run as steps.
    let upstream = match capture && !pg.sources.iter().any(|s| matches!(s, Source::Sharded(_))) {
        true => {
            let device = pg.client.device(pg.device_index)?;
            let none_failed = pg
                .client
                .buffer_from_host(&[0], DType::Bool, &[], &device)?;
            let ty = TensorType::new(DType::Bool, &[]);
            let read_as = ReadAs::of_type(&ty, ReadFrom::Storage);
            Some(pg.add_param(ty, Source::Buffer(Arc::new(none_failed)), read_as))
        }
        false => None,
    };
    let PendingGraph {
        client,
        device_index,
        mut graph,
        sources,
        param_op,
        slots,
        ops,
        op_ends,
        checks,
        ..
    } = pg;

    let mut written = Vec::new();
    for slot in &slots {
        if let (true, Some(storage)) = (slot.written, slot.storage.upgrade()) {
            written.push((storage, slot));
        }
    }
    if written.is_empty() {
        return Ok(None);
    }
    let flags: Vec<ValueId> = checks.iter().map(|(flag, ..)| *flag).collect();
    let mut writes: Vec<(ValueId, Option<usize>)> = written
        .iter()
        .map(|(_, slot)| (slot.value, slot.param))
        .collect();
    let all_flags: Vec<ValueId> = upstream
        .iter()
        .map(|&(_, value)| value)
        .chain(flags.iter().copied())
        .collect();
    let (kept_on_failure, failed) = keep_old_values_on_failure(&mut graph, &all_flags, &mut writes);
    let mut outputs: Vec<ValueId> = writes.iter().map(|&(value, _)| value).collect();
    let written_count = outputs.len();
    outputs.extend(flags);
    // The chained flag, the captured graph's last output.
    outputs.extend(failed.filter(|_| upstream.is_some()));
    // Op boundaries in the pruned graph, for naming the op that failed it.
    let mut op_ends = op_ends;
    let (mut pruned, kept) = graph.prune(&outputs, &mut op_ends);
    read_kept_values(&mut pruned, &kept_on_failure);
    // A buffer held only by this graph belongs to a storage the graph
    // overwrites: XLA may reuse its memory for the new value. A capture
    // donates nothing now but lets its replays donate any such input.
    pruned.donors = kept
        .iter()
        .enumerate()
        .filter(|(_, &old)| match &sources[old] {
            // A replayed executable (see `upstream`).
            Source::Buffer(_) if upstream.is_some() => true,
            _ if capture => false,
            Source::Buffer(b) => Arc::strong_count(b) == 1,
            Source::Sharded(s) => {
                Arc::strong_count(s) == 1 && s.buffers.iter().all(|b| Arc::strong_count(b) == 1)
            }
            Source::Host { .. } => false,
        })
        .filter_map(|(new, &old)| {
            let output = writes.iter().position(|&(_, param)| param == Some(old))?;
            Some(Donor { param: new, output })
        })
        .collect();
    let provenance = cache::Provenance {
        site,
        ops: &ops,
        params: kept.iter().map(|&p| param_op[p].clone()).collect(),
    };
    // A failed check of an earlier graph means this one may read its
    // wrong values: that fails it first.
    let result = verify_checks().and_then(|()| match spmd::mesh_of(&kept, &sources)? {
        None => execute(
            &client,
            device_index,
            &pruned,
            &kept,
            &sources,
            Some(&provenance),
            !capture,
        )
        .map(|(exe, buffers)| {
            let computed: Vec<Computed> = buffers.into_iter().map(Computed::Buffer).collect();
            (Some(exe), computed)
        }),
        // A captured SPMD graph keeps no executable: its replays record it
        // into the pending graph, which runs it over its inputs' mesh.
        Some(mesh) => {
            // A storage the graph overwrites keeps the layout it had.
            let layouts = written
                .iter()
                .map(
                    |(_, slot)| match (slot.param.map(|p| &sources[p]), &slot.before) {
                        (Some(Source::Sharded(shards)), _) => Some(shards.clone()),
                        (_, Some(StorageValue::Sharded { shards, .. })) => Some(shards.clone()),
                        _ => None,
                    },
                )
                .collect();
            let read_only = slots
                .iter()
                .filter(|slot| !slot.written)
                .filter_map(|slot| Some((slot.param?, slot.storage.upgrade()?)))
                .collect();
            let spmd_run = spmd::Run {
                mesh: &mesh,
                graph: &pruned,
                kept: &kept,
                sources: &sources,
            };
            spmd_run
                .run(&client, layouts, read_only, Some(&provenance))
                .map(|outputs| (None, outputs))
        }
    });
    match result {
        Ok((exe, mut computed)) => {
            let mut flags = computed
                .split_off(written_count)
                .into_iter()
                .map(Computed::into_flag)
                .collect::<Result<Vec<Buffer>>>()?;
            let chain = match upstream {
                Some(_) => {
                    let failed = flags.pop().ok_or_else(|| {
                        Error::invalid("outputs of a captured graph", "its chained flag", "none")
                    })?;
                    Some(((client.id(), device_index), Arc::new(failed)))
                }
                None => None,
            };
            let mut latest = Vec::with_capacity(computed.len());
            for ((storage, _), value) in written.iter().zip(computed) {
                let (value, watched) = value.into_value()?;
                latest.push(Arc::downgrade(&watched));
                storage.set_recorded(value);
            }
            let checks: Vec<((ErrorCode, String), usize)> = checks
                .into_iter()
                .map(|(_, error, op)| (error, op))
                .collect();
            let on_failure = written
                .iter()
                .zip(&kept_on_failure)
                .map(|((_, slot), &kept)| match &slot.before {
                    _ if kept => OnFailure::keep(slot.before.as_ref()),
                    Some(before) if !matches!(before, StorageValue::Pending { .. }) => {
                        OnFailure::Restore(before.clone())
                    }
                    _ => OnFailure::Lose,
                })
                .collect();
            let written: Vec<Arc<Storage>> = written.into_iter().map(|(s, _)| s).collect();
            watch_checks(
                Ran {
                    site,
                    ops: &ops,
                    flags,
                    checks: &checks,
                    written: &written,
                    latest: &latest,
                    on_failure,
                },
                chain,
            );
            Ok(capture.then(|| RanGraph {
                graph: pruned,
                exe,
                upstream: upstream.and_then(|(index, _)| kept.iter().position(|&p| p == index)),
                sources: kept.iter().map(|&p| sources[p].clone()).collect(),
                written,
                checks,
                kept_on_failure,
                ops,
            }))
        }
        Err(error) => {
            let error = match error {
                // Already says what failed and where.
                Error::RecompileLimit { .. } | Error::DeferredGraph { .. } => error,
                _ => {
                    let kept_sources: Vec<Source> =
                        kept.iter().map(|&p| sources[p].clone()).collect();
                    let culprit =
                        find_culprit(&client, device_index, &pruned, &kept_sources, &op_ends);
                    graph_error((error.code(), error.to_string()), site, &ops, culprit)
                }
            };
            // Nothing is lost: storages the graph would have overwritten
            // keep their values; values only it would have made are errors.
            for (storage, slot) in &written {
                let restored = match (slot.param, &slot.before) {
                    (Some(p), _) => match &sources[p] {
                        Source::Buffer(buffer) => {
                            buffer.dtype().ok().map(|dtype| StorageValue::Buffer {
                                buffer: buffer.clone(),
                                dtype,
                            })
                        }
                        Source::Sharded(shards) => {
                            shards.buffers[0]
                                .dtype()
                                .ok()
                                .map(|dtype| StorageValue::Sharded {
                                    shards: shards.clone(),
                                    dtype,
                                })
                        }
                        Source::Host { .. } => None,
                    },
                    (None, Some(before)) if !matches!(before, StorageValue::Pending { .. }) => {
                        Some(before.clone())
                    }
                    _ => None,
                };
                storage.set_recorded(restored.unwrap_or(StorageValue::Failed {
                    code: error.code(),
                    message: error.to_string(),
                }));
            }
            Err(error)
        }
    }
}
