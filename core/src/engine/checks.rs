//! Device-side checks: flags a graph computes when an op's input was bad
//! (an index out of range found on the device), read at the next sync point
//! and raised as errors naming the op and its line.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use super::deferred::RecordedOp;
use super::failure::graph_error;
use crate::error::{ErrorCode, Result};
use crate::metrics::{self, Metric};
use crate::runtime::Buffer;
use crate::storage::{Storage, StorageValue};

/// The outputs of each device's latest graph (what `synchronize` waits for:
/// every later graph reads the values of the ones before it).
pub(super) fn latest_outputs() -> MutexGuard<'static, Vec<Weak<Buffer>>> {
    static LATEST: OnceLock<Mutex<Vec<Weak<Buffer>>>> = OnceLock::new();
    LATEST
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Registers the check flags a graph's run produced, to be read at the next
/// sync point; `latest` are the buffers it installed in `written`.
pub(super) fn watch_checks(
    site: u32,
    ops: &[RecordedOp],
    flags: Vec<Buffer>,
    checks: &[((ErrorCode, String), usize)],
    written: &[Arc<Storage>],
    latest: &[Weak<Buffer>],
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
            .map(Arc::downgrade)
            .zip(latest.iter().cloned())
            .collect(),
    });
}

/// The device-side checks of a graph that ran, read at the next sync point.
struct PendingCheck {
    site: u32,
    ops: Vec<RecordedOp>,
    /// Per check: its flag, the error it raises (code, message), its op.
    flags: Vec<(Buffer, (ErrorCode, String), usize)>,
    /// The graph's outputs, failed if a check does: their values may be
    /// wrong (XLA clamps out-of-range gathers).
    outputs: Vec<(Weak<Storage>, Weak<Buffer>)>,
}

fn pending_checks() -> MutexGuard<'static, Vec<PendingCheck>> {
    static CHECKS: OnceLock<Mutex<Vec<PendingCheck>>> = OnceLock::new();
    CHECKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Reads the flags of graphs that ran with device-side checks (waiting for
/// them). A failed check is an error naming the op and its line; the
/// graph's outputs then hold that error instead of their values.
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
        for (storage, buffer) in &graph.outputs {
            let Some(storage) = storage.upgrade() else {
                continue;
            };
            if let StorageValue::Buffer {
                buffer: current, ..
            } = storage.recorded_value()
            {
                if std::ptr::eq(Arc::as_ptr(&current), buffer.as_ptr()) {
                    storage.set_recorded(StorageValue::Failed {
                        code: error.code(),
                        message: error.to_string(),
                    });
                }
            }
        }
        return Err(error);
    }
    Ok(())
}
