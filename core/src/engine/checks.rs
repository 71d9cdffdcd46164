//! Device-side checks: flags a graph computes when an op's input was bad
//! (an index out of range found on the device), read at the next sync point
//! and raised as errors naming the op and its line.
//!
//! A replayed captured graph does not wait for the checks of the graphs
//! before it. It takes their combined flag as an input (its upstream
//! flag), keeps the old value of every storage it overwrites when that flag
//! is set, and hands on the flag combined with its own checks. So compiled
//! forward, backward and optimizer graphs launch back to back while the
//! host runs ahead, and one failed check undoes the graphs chained after
//! it as well as its own: the error is raised at the next sync point.

use std::collections::{HashMap, HashSet};
use std::iter;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use super::deferred::RecordedOp;
use super::failure::graph_error;
use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};
use crate::ir::{BinaryOp, Graph, Node, TensorType, ValueId};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client};
use crate::storage::{Storage, StorageValue};

/// At most this many graphs run unchecked: a replay past it waits for the
/// oldest, so a loop that never syncs neither queues work without bound nor
/// keeps going long after a check failed.
const MAX_UNCHECKED_GRAPHS: usize = 8;

/// What a storage a graph wrote holds once one of the graph's checks (or
/// its upstream flag) is found to have failed.
pub(super) enum OnFailure {
    /// The graph wrote the old value back itself (`keep_old_values_on_failure`):
    /// that of `replaced`, the buffer the storage held before, when known.
    Keep { replaced: Weak<Buffer> },
    /// This value, the one the storage held before the graph.
    Restore(StorageValue),
    /// The error: the value existed only as the graph's output.
    Lose,
}

impl OnFailure {
    /// `Keep`, naming the buffer of `before` (the storage's value before the
    /// graph) if it has one.
    pub(super) fn keep(before: Option<&StorageValue>) -> OnFailure {
        OnFailure::Keep {
            replaced: before
                .and_then(buffer_of)
                .map_or_else(Weak::new, Arc::downgrade),
        }
    }
}

/// The buffer a storage value lives in (a sharded one's first shard).
fn buffer_of(value: &StorageValue) -> Option<&Arc<Buffer>> {
    match value {
        StorageValue::Buffer { buffer, .. } => Some(buffer),
        StorageValue::Sharded { shards, .. } => shards.buffers.first(),
        _ => None,
    }
}

/// Makes a graph with device-side checks all or nothing for the storages it
/// reads and overwrites: each such write becomes `select(any check failed,
/// old, new)`. The old buffer may be donated to the graph, so only the graph
/// itself can still give the old value back. `writes` are the graph's
/// outputs with the parameter that read the same storage, if one did.
/// Returns which outputs now keep their old value on failure, and the
/// graph's value that says whether any flag is set (None without flags).
pub(super) fn keep_old_values_on_failure(
    graph: &mut Graph,
    flags: &[ValueId],
    writes: &mut [(ValueId, Option<usize>)],
) -> (Vec<bool>, Option<ValueId>) {
    let Some((&first, rest)) = flags.split_first() else {
        return (vec![false; writes.len()], None);
    };
    let push = |graph: &mut Graph, node: Node, ty: TensorType| {
        graph.nodes.push((node, ty));
        graph.nodes.len() - 1
    };
    let scalar_bool = TensorType::new(DType::Bool, &[]);
    let failed = rest.iter().fold(first, |any, &flag| {
        push(
            graph,
            Node::Binary(BinaryOp::Or, any, flag),
            scalar_bool.clone(),
        )
    });
    let param_values: HashMap<usize, ValueId> = graph
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(id, (node, _))| match node {
            Node::Param(p) => Some((*p, id)),
            _ => None,
        })
        .collect();
    let kept = writes
        .iter_mut()
        .map(|(value, param)| {
            let Some(&old) = param.and_then(|p| param_values.get(&p)) else {
                return false;
            };
            let ty = graph.ty(*value).clone();
            if graph.ty(old) != &ty {
                return false;
            }
            let pred = push(
                graph,
                Node::Broadcast {
                    operand: failed,
                    dims: Vec::new(),
                },
                TensorType::new(DType::Bool, &ty.dims),
            );
            let on_false = *value;
            *value = push(
                graph,
                Node::Select {
                    pred,
                    on_true: old,
                    on_false,
                },
                ty,
            );
            true
        })
        .collect();
    (kept, Some(failed))
}

/// Has every node of a pruned graph that reads a value
/// `keep_old_values_on_failure` selected on (outputs with `kept_on_failure`
/// set) read the selected value instead, but for the checks, which decide it.
/// Both are equal unless a check failed, and then every output keeps its old
/// value anyway. An optimizer's update of the weight then reads the new `m`
/// from `m`'s output, as in JAX's programs. Otherwise XLA fuses the new `m`
/// into both that update and the select, so the update reads the old `m`
/// after its donated buffer was overwritten: a copy of the buffer per step.
pub(super) fn read_kept_values(graph: &mut Graph, kept_on_failure: &[bool]) {
    let mut selected_of = HashMap::new();
    let mut failed = None;
    for (&select, _) in graph
        .outputs
        .iter()
        .zip(kept_on_failure)
        .filter(|(_, &kept)| kept)
    {
        if let Node::Select { pred, on_false, .. } = graph.nodes[select].0 {
            selected_of.entry(on_false).or_insert(select);
            if let Node::Broadcast { operand, .. } = graph.nodes[pred].0 {
                failed = Some(operand);
            }
        }
    }
    let Some(failed) = failed else { return };
    // The checks and what they read; nothing after `failed` feeds it.
    let mut feeds_failed = vec![false; graph.nodes.len()];
    feeds_failed[failed] = true;
    for id in (0..=failed).rev() {
        if feeds_failed[id] {
            graph.nodes[id]
                .0
                .for_each_operand(|v| feeds_failed[v] = true);
        }
    }
    let selects: HashSet<ValueId> = selected_of.values().copied().collect();
    let mut redirected = false;
    for (id, (node, _)) in graph.nodes.iter_mut().enumerate() {
        if !feeds_failed[id] && !selects.contains(&id) {
            node.for_each_operand_mut(|v| {
                if let Some(&selected) = selected_of.get(v) {
                    *v = selected;
                    redirected = true;
                }
            });
        }
    }
    if redirected {
        graph.sort_operands_first();
    }
}

/// What a graph that ran leaves to check.
pub(super) struct Ran<'a> {
    pub site: u32,
    pub ops: &'a [RecordedOp],
    /// The graph's own check flags, and per flag its error and op.
    pub flags: Vec<Buffer>,
    pub checks: &'a [((ErrorCode, String), usize)],
    /// The storages the graph wrote, the buffer it installed in each, and
    /// what each holds instead if a check failed.
    pub written: &'a [Arc<Storage>],
    pub latest: &'a [Weak<Buffer>],
    pub on_failure: Vec<OnFailure>,
}

/// A chained graph's place in the chain: its device (client id, device
/// index) and its flag, set if it or any graph checked before it failed.
pub(super) type Chain = ((usize, usize), Arc<Buffer>);

/// Registers what a graph's run left to check, read at the next sync point.
/// A chained graph is registered even without checks of its own: a failed
/// check before it undoes it too.
pub(super) fn watch_checks(ran: Ran<'_>, chain: Option<Chain>) {
    if ran.flags.is_empty() && chain.is_none() {
        return;
    }
    pending_checks().push(PendingCheck {
        site: ran.site,
        ops: ran.ops.to_vec(),
        flags: ran
            .flags
            .into_iter()
            .zip(ran.checks.iter().cloned())
            .map(|(flag, (error, op))| (flag, error, op))
            .collect(),
        outputs: ran
            .written
            .iter()
            .zip(ran.latest)
            .zip(ran.on_failure)
            .map(|((storage, buffer), on_failure)| {
                (Arc::downgrade(storage), buffer.clone(), on_failure)
            })
            .collect(),
        chain,
    });
}

/// The device-side checks of a graph that ran, read at the next sync point.
struct PendingCheck {
    site: u32,
    ops: Vec<RecordedOp>,
    /// Per check: its flag, the error it raises (code, message), its op.
    flags: Vec<(Buffer, (ErrorCode, String), usize)>,
    /// The graph's outputs: the buffer each storage got, and what it holds
    /// instead if a check failed (the values may be wrong: XLA clamps
    /// out-of-range gathers).
    outputs: Vec<(Weak<Storage>, Weak<Buffer>, OnFailure)>,
    /// Set for a chained graph. Its flag covers every graph registered
    /// before it: it took their combined flag as its upstream one.
    chain: Option<Chain>,
}

fn pending_checks() -> MutexGuard<'static, Vec<PendingCheck>> {
    static CHECKS: OnceLock<Mutex<Vec<PendingCheck>>> = OnceLock::new();
    super::global(&CHECKS)
}

/// The upstream flag of a captured graph about to be replayed on
/// `device_index` of `client`: the flag of the last graph registered, when
/// it covers all that wait to be checked; None when none wait. Graphs the
/// flag cannot cover (another device's, a step's) are waited for and checked
/// first, as are the oldest past `MAX_UNCHECKED_GRAPHS`.
pub(super) fn upstream_flag(client: &Client, device_index: usize) -> Result<Option<Arc<Buffer>>> {
    let (covering, unchecked) = {
        let pending = pending_checks();
        let covering = match pending.last().map(|graph| &graph.chain) {
            Some(Some((device, flag))) if *device == (client.id(), device_index) => {
                Some(flag.clone())
            }
            _ => None,
        };
        (covering, pending.len())
    };
    if covering.is_none() {
        verify_checks()?;
        return Ok(None);
    }
    verify_oldest(unchecked.saturating_sub(MAX_UNCHECKED_GRAPHS))?;
    Ok(covering)
}

/// Reads the flags of graphs that ran with device-side checks (waiting for
/// them). A failed check is an error naming the op and its line; the
/// storages the graph (and every graph chained after it) wrote then hold
/// their old values where those exist, and that error where the graphs
/// made them.
pub(crate) fn verify_checks() -> Result<()> {
    verify_oldest(usize::MAX)
}

/// `verify_checks` for the `count` oldest graphs waiting to be checked.
fn verify_oldest(count: usize) -> Result<()> {
    for _ in 0..count {
        let graph = {
            let mut pending = pending_checks();
            if pending.is_empty() {
                break;
            }
            pending.remove(0)
        };
        if let Some(check) = failed_check(&graph)? {
            // Every graph registered after it took its flag as upstream.
            let chained = std::mem::take(&mut *pending_checks());
            return Err(undo(graph, check, chained));
        }
    }
    Ok(())
}

/// The index in `graph.flags` of its first check that failed.
fn failed_check(graph: &PendingCheck) -> Result<Option<usize>> {
    for (i, (flag, ..)) in graph.flags.iter().enumerate() {
        let start = Instant::now();
        let bytes = flag.to_host();
        metrics::add_elapsed(Metric::WaitNs, start);
        if bytes?.first().is_some_and(|&b| b != 0) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Gives the storages that `failed` and the graphs `chained` after it wrote
/// what they hold on failure; returns the failed check's error.
fn undo(failed: PendingCheck, check: usize, chained: Vec<PendingCheck>) -> Error {
    let (_, error, op) = &failed.flags[check];
    let error = graph_error(error.clone(), failed.site, &failed.ops, Some(*op));
    // Newest first. A chained graph that kept a storage's value installed a
    // new buffer holding the old value: `replaced_by` maps it to the buffer
    // it replaced, so the graph that wrote that one still finds its value.
    let mut replaced_by: HashMap<*const Buffer, Weak<Buffer>> = HashMap::new();
    for graph in chained.into_iter().rev().chain(iter::once(failed)) {
        for (storage, latest, on_failure) in graph.outputs {
            let Some(storage) = storage.upgrade() else {
                continue;
            };
            let mut current = buffer_of(&storage.recorded_value()).map(Arc::as_ptr);
            while current.is_some_and(|c| c != latest.as_ptr()) {
                current = current.and_then(|c| replaced_by.get(&c)).map(Weak::as_ptr);
            }
            // A storage written again since holds a later value: leave it.
            if current.is_none() {
                continue;
            }
            match on_failure {
                OnFailure::Keep { replaced } => {
                    replaced_by.insert(latest.as_ptr(), replaced);
                }
                OnFailure::Restore(before) => storage.set_recorded(before),
                OnFailure::Lose => storage.set_recorded(StorageValue::Failed {
                    code: error.code(),
                    message: error.to_string(),
                }),
            }
        }
    }
    error
}
