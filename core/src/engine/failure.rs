//! What a failed deferred graph's error says: which op made it fail (found
//! by running prefixes of the graph) and the lines that recorded its ops.

use super::deferred::{execute, prune, RecordedOp, Source};
use super::location::location_text;
use crate::error::{Error, ErrorCode};
use crate::ir::{Graph, Node, ValueId};
use crate::runtime::Client;

/// Graphs of at most this many ops are searched for the op that makes them
/// fail (each probe compiles and runs a prefix of the graph).
const MAX_OPS_TO_SEARCH: usize = 512;

/// The first op whose prefix of the graph fails on its own: what a failed
/// graph's error names. Bisects over prefixes, each run with every value it
/// makes as an output (so nothing is pruned away) and nothing donated.
pub(super) fn find_culprit(
    client: &Client,
    device_index: usize,
    graph: &Graph,
    sources: &[Source],
    op_ends: &[usize],
) -> Option<usize> {
    if op_ends.is_empty() || op_ends.len() > MAX_OPS_TO_SEARCH {
        return None;
    }
    let fails = |op: usize| -> bool {
        let end = op_ends[op];
        let outputs: Vec<ValueId> = (0..end)
            .filter(|&id| !matches!(graph.nodes[id].0, Node::Param(_) | Node::Constant(_)))
            .collect();
        if outputs.is_empty() {
            return false;
        }
        let prefix = Graph {
            params: graph.params.clone(),
            nodes: graph.nodes[..end].to_vec(),
            outputs: Vec::new(),
            donors: Vec::new(),
        };
        let (prefix, kept) = prune(&prefix, &outputs);
        execute(client, device_index, &prefix, &kept, sources, None).is_err()
    };
    let (mut good, mut bad) = (None::<usize>, op_ends.len() - 1);
    if !fails(bad) {
        return None;
    }
    // Invariant: prefix `bad` fails, prefix `good` (if any) runs.
    loop {
        let low = good.map_or(0, |g| g + 1);
        if low >= bad {
            return Some(bad);
        }
        let mid = low + (bad - low) / 2;
        if fails(mid) {
            bad = mid;
        } else {
            good = Some(mid);
        }
    }
}

/// Wraps a failure of a deferred graph with where its ops came from.
pub(super) fn graph_error(
    (code, message): (ErrorCode, String),
    site: u32,
    ops: &[RecordedOp],
    culprit: Option<usize>,
) -> Error {
    let mut lines: Vec<u32> = Vec::new();
    for op in ops {
        if op.location != 0 && !lines.contains(&op.location) {
            lines.push(op.location);
        }
    }
    let shown: Vec<String> = lines.iter().take(6).map(|&l| location_text(l)).collect();
    let more = if lines.len() > shown.len() {
        format!(" and {} more", lines.len() - shown.len())
    } else {
        String::new()
    };
    Error::DeferredGraph {
        site: location_text(site),
        ops: format!(
            "{} ops recorded at {}{more}",
            ops.len(),
            if shown.is_empty() {
                "unknown lines".to_string()
            } else {
                shown.join(", ")
            }
        ),
        culprit: culprit
            .map(|i| {
                format!(
                    " in op {i}, {} recorded at {}",
                    ops[i].name,
                    location_text(ops[i].location)
                )
            })
            .unwrap_or_default(),
        code,
        message,
    }
}
