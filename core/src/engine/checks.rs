//! Device-side checks: flags a graph computes when an op's input was bad
//! (an index out of range found on the device), read at the next sync point
//! and raised as errors naming the op and its line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use super::deferred::RecordedOp;
use super::failure::graph_error;
use crate::dtype::DType;
use crate::error::{ErrorCode, Result};
use crate::ir::{BinaryOp, Graph, Node, TensorType, ValueId};
use crate::metrics::{self, Metric};
use crate::runtime::Buffer;
use crate::storage::{Storage, StorageValue};

/// What a storage a graph wrote holds once one of the graph's checks is
/// found to have failed.
pub(super) enum OnFailure {
    /// The graph wrote the old value back itself (`keep_old_values_on_failure`).
    Keep,
    /// This value, the one the storage held before the graph.
    Restore(StorageValue),
    /// The error: the value existed only as the graph's output.
    Lose,
}

/// Makes a graph with device-side checks all or nothing for the storages it
/// reads and overwrites: each such write becomes `select(any check failed,
/// old, new)`. The old buffer may be donated to the graph, so only the graph
/// itself can still give the old value back. `writes` are the graph's
/// outputs with the parameter that read the same storage, if one did; the
/// result says which outputs now keep their old value on failure.
pub(super) fn keep_old_values_on_failure(
    graph: &mut Graph,
    flags: &[ValueId],
    writes: &mut [(ValueId, Option<usize>)],
) -> Vec<bool> {
    let Some((&first, rest)) = flags.split_first() else {
        return vec![false; writes.len()];
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
    writes
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
        .collect()
}

/// Registers the check flags a graph's run produced, to be read at the next
/// sync point; `latest` are the buffers it installed in `written`, and
/// `on_failure` says what each written storage holds if a check failed.
pub(super) fn watch_checks(
    site: u32,
    ops: &[RecordedOp],
    flags: Vec<Buffer>,
    checks: &[((ErrorCode, String), usize)],
    written: &[Arc<Storage>],
    latest: &[Weak<Buffer>],
    on_failure: Vec<OnFailure>,
) {
    if flags.is_empty() {
        return;
    }
    pending_checks().push(PendingCheck {
        site,
        ops: ops.to_vec(),
        flags: flags
            .into_iter()
            .zip(checks.iter().cloned())
            .map(|(flag, (error, op))| (flag, error, op))
            .collect(),
        outputs: written
            .iter()
            .zip(latest)
            .zip(on_failure)
            .map(|((storage, buffer), on_failure)| {
                (Arc::downgrade(storage), buffer.clone(), on_failure)
            })
            .collect(),
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
}

fn pending_checks() -> MutexGuard<'static, Vec<PendingCheck>> {
    static CHECKS: OnceLock<Mutex<Vec<PendingCheck>>> = OnceLock::new();
    super::global(&CHECKS)
}

/// Reads the flags of graphs that ran with device-side checks (waiting for
/// them). A failed check is an error naming the op and its line; the
/// storages the graph wrote then hold their old values where those exist,
/// and that error where the graph made them.
pub(crate) fn verify_checks() -> Result<()> {
    let mut graphs = std::mem::take(&mut *pending_checks()).into_iter();
    while let Some(graph) = graphs.next() {
        let mut failed_op = None;
        for (flag, _, op) in &graph.flags {
            let start = Instant::now();
            let bytes = flag.to_host();
            metrics::add_elapsed(Metric::WaitNs, start);
            if bytes?.first().is_some_and(|&b| b != 0) {
                failed_op = Some(*op);
                break;
            }
        }
        let Some(op) = failed_op else {
            continue;
        };
        // Later graphs stay to be checked at the next sync point.
        pending_checks().extend(graphs.by_ref());
        let Some((_, error, _)) = graph.flags.into_iter().find(|(_, _, o)| *o == op) else {
            continue;
        };
        let error = graph_error(error, graph.site, &graph.ops, Some(op));
        for (storage, buffer, on_failure) in graph.outputs {
            let Some(storage) = storage.upgrade() else {
                continue;
            };
            // A storage written again since holds a later value: leave it.
            let unchanged = match storage.recorded_value() {
                StorageValue::Buffer {
                    buffer: current, ..
                } => std::ptr::eq(Arc::as_ptr(&current), buffer.as_ptr()),
                StorageValue::Sharded { shards, .. } => {
                    std::ptr::eq(Arc::as_ptr(&shards.buffers[0]), buffer.as_ptr())
                }
                _ => false,
            };
            match on_failure {
                _ if !unchanged => {}
                OnFailure::Keep => {}
                OnFailure::Restore(before) => storage.set_recorded(before),
                OnFailure::Lose => storage.set_recorded(StorageValue::Failed {
                    code: error.code(),
                    message: error.to_string(),
                }),
            }
        }
        return Err(error);
    }
    Ok(())
}
