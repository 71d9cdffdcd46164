//! What a failed deferred graph's error says: which op made it fail (found
//! by running prefixes of the graph) and the lines that recorded its ops.

use super::deferred::RecordedOp;
use super::launch::{execute, Source};
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
            spmd: None,
        };
        let (prefix, kept) = prefix.prune(&outputs, &mut []);
        execute(client, device_index, &prefix, &kept, sources, None, false).is_err()
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dtype::DType;
    use crate::ir::{TensorType, UnaryOp};
    use crate::runtime::{self, CreateOption};

    /// The CPU plugin of `$RTPU_PLUGIN` (`scripts/test` sets it).
    fn client() -> Client {
        let path = runtime::resolve_plugin_path(None).expect("RTPU_PLUGIN names the CPU plugin");
        let plugin = runtime::load(&path).expect("load the CPU plugin");
        Client::create(plugin, &[("cpu_device_count", CreateOption::Int(1))]).expect("a client")
    }

    /// exp, then a reshape XLA rejects (4 elements as 5), then exp again:
    /// three ops, one node each after the parameter.
    fn graph_failing_in_op_1() -> (Graph, Vec<usize>) {
        let vector = |n| TensorType::new(DType::F32, &[n]);
        let nodes = vec![
            (Node::Param(0), vector(4)),
            (Node::Unary(UnaryOp::Exp, 0), vector(4)),
            (Node::Reshape(1), vector(5)),
            (Node::Unary(UnaryOp::Exp, 2), vector(5)),
        ];
        let graph = Graph {
            params: vec![vector(4)],
            nodes,
            outputs: vec![3],
            donors: Vec::new(),
            spmd: None,
        };
        (graph, vec![2, 3, 4])
    }

    #[test]
    fn the_culprit_is_the_first_op_whose_prefix_fails() {
        let client = client();
        let device = client.device(0).unwrap();
        let x = client
            .buffer_from_host(&[0u8; 16], DType::F32, &[4], &device)
            .unwrap();
        let sources = [Source::Buffer(Arc::new(x))];
        let (graph, op_ends) = graph_failing_in_op_1();
        assert_eq!(
            find_culprit(&client, 0, &graph, &sources, &op_ends),
            Some(1)
        );
        // Without the bad op nothing fails, so nothing is named.
        let (mut graph, _) = graph_failing_in_op_1();
        graph.nodes.truncate(2);
        graph.outputs = vec![1];
        assert_eq!(find_culprit(&client, 0, &graph, &sources, &[2]), None);
    }
}
