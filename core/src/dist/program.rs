//! The XLA program of one collective: a graph with one replica per rank,
//! lowered to StableHLO like any op's graph.

use super::{Collective, ReduceOp};
use crate::dtype::{Category, DType};
use crate::error::Result;
use crate::ir::{
    self, BinaryOp, CollectiveOp, CompareDir, Graph, Literal, Node, TensorType, ValueId,
};
use crate::lower::lower;
use crate::runtime::{Client, CompileOptions, LoadedExecutable};

/// Why a rank's tensor cannot take part in `collective` over `size` ranks,
/// as the "expected" half of an error; Ok when it can.
pub(super) fn check_supported(
    collective: Collective,
    dtype: DType,
    dims: &[i64],
    size: usize,
) -> std::result::Result<(), String> {
    let float = dtype.category() == Category::Float;
    let integer = dtype.category() == Category::Integer;
    let reduces = matches!(
        collective,
        Collective::AllReduce(_) | Collective::ReduceScatter(_) | Collective::Broadcast { .. }
    );
    if !(float || integer || (dtype == DType::Bool && !reduces)) {
        return Err(format!(
            "a real dtype (floating-point or integer{})",
            if reduces { "" } else { ", or bool" }
        ));
    }
    if matches!(
        collective,
        Collective::AllReduce(ReduceOp::Avg) | Collective::ReduceScatter(ReduceOp::Avg)
    ) && !float
    {
        return Err("a floating-point dtype for Avg".to_string());
    }
    let splits = matches!(
        collective,
        Collective::ReduceScatter(_) | Collective::AllToAll
    );
    let along_dim0 = splits || collective == Collective::AllGather;
    if along_dim0 && dims.is_empty() {
        return Err(
            "a tensor with at least one dim (the collective works along dim 0)".to_string(),
        );
    }
    if splits && dims[0] % size as i64 != 0 {
        return Err(format!("dim 0 divisible by the {size} ranks"));
    }
    Ok(())
}

/// Compiles `collective` on tensors stored as `stored` dims and read as
/// `dims`, one replica per device id in `device_ids` (rank order).
pub(super) fn compile(
    client: &Client,
    collective: Collective,
    dtype: DType,
    stored: &[i64],
    dims: &[i64],
    device_ids: &[i64],
) -> Result<LoadedExecutable> {
    let graph = graph(collective, dtype, stored, dims, device_ids.len());
    let options = CompileOptions {
        num_replicas: device_ids.len(),
        device_assignment: Some(device_ids.iter().map(|&id| vec![id]).collect()),
        ..CompileOptions::default()
    };
    client.compile(&lower(&graph), &options)
}

fn graph(collective: Collective, dtype: DType, stored: &[i64], dims: &[i64], size: usize) -> Graph {
    let mut g = Graph::default();
    let groups = vec![(0..size as i64).collect::<Vec<i64>>()];
    let ty = TensorType::new(dtype, dims);
    let mut push = |g: &mut Graph, node: Node, ty: TensorType| -> ValueId {
        g.nodes.push((node, ty));
        g.nodes.len() - 1
    };
    // One collective over all the ranks.
    let over_ranks = |op: CollectiveOp, operand: ValueId| Node::Collective {
        op,
        operand,
        groups: groups.clone(),
    };
    if collective == Collective::Barrier {
        let scalar = TensorType::new(DType::I32, &[]);
        let zero = push(&mut g, Node::Constant(Literal::Int(0)), scalar.clone());
        let all = push(
            &mut g,
            over_ranks(CollectiveOp::AllReduce(ir::ReduceOp::Sum), zero),
            scalar,
        );
        g.outputs = vec![all];
        return g;
    }
    g.params.push(TensorType::new(dtype, stored));
    let mut x = push(&mut g, Node::Param(0), TensorType::new(dtype, stored));
    if stored != dims {
        x = push(&mut g, Node::Reshape(x), ty.clone());
    }
    let rows = |factor: i64, divide: bool| {
        let mut out = dims.to_vec();
        out[0] = if divide {
            out[0] / factor
        } else {
            out[0] * factor
        };
        TensorType::new(dtype, &out)
    };
    let out = match collective {
        Collective::AllReduce(op) => {
            let sum = push(
                &mut g,
                over_ranks(CollectiveOp::AllReduce(reduce_op(op)), x),
                ty.clone(),
            );
            average(&mut g, &mut push, op, sum, &ty, size)
        }
        Collective::ReduceScatter(op) => {
            let piece = rows(size as i64, true);
            let sum = push(
                &mut g,
                over_ranks(
                    CollectiveOp::ReduceScatter {
                        op: reduce_op(op),
                        dim: 0,
                    },
                    x,
                ),
                piece.clone(),
            );
            average(&mut g, &mut push, op, sum, &piece, size)
        }
        Collective::AllGather => push(
            &mut g,
            over_ranks(CollectiveOp::AllGather { dim: 0 }, x),
            rows(size as i64, false),
        ),
        Collective::AllToAll => push(
            &mut g,
            over_ranks(CollectiveOp::AllToAll { dim: 0 }, x),
            ty.clone(),
        ),
        // StableHLO's collective_broadcast is not supported on the CPU
        // plugins: the root keeps its value, the others contribute zeros,
        // and a sum gives everyone the root's.
        Collective::Broadcast { root } => {
            let id_ty = TensorType::new(DType::U32, &[]);
            let me = push(&mut g, Node::ReplicaId, id_ty.clone());
            let root = push(&mut g, Node::Constant(Literal::Int(root as i64)), id_ty);
            let is_root = push(
                &mut g,
                Node::Compare(CompareDir::Eq, me, root),
                TensorType::new(DType::Bool, &[]),
            );
            let pred = push(
                &mut g,
                Node::Broadcast {
                    operand: is_root,
                    dims: Vec::new(),
                },
                TensorType::new(DType::Bool, dims),
            );
            let zeros = push(&mut g, Node::Constant(Literal::Int(0)), ty.clone());
            let mine = push(
                &mut g,
                Node::Select {
                    pred,
                    on_true: x,
                    on_false: zeros,
                },
                ty.clone(),
            );
            push(
                &mut g,
                over_ranks(CollectiveOp::AllReduce(ir::ReduceOp::Sum), mine),
                ty.clone(),
            )
        }
        Collective::Barrier => unreachable!("handled above"),
    };
    // A storage's buffer is flat (its elements densely, as the engine
    // reads them), whatever the tensor's dims.
    let out_ty = g.nodes[out].1.clone();
    let flat = TensorType::new(dtype, &[out_ty.dims.iter().product()]);
    let out = if out_ty.dims == flat.dims {
        out
    } else {
        push(&mut g, Node::Reshape(out), flat)
    };
    g.outputs = vec![out];
    g
}

/// `sum` divided by the rank count for `Avg`; `sum` itself otherwise.
fn average(
    g: &mut Graph,
    push: &mut impl FnMut(&mut Graph, Node, TensorType) -> ValueId,
    op: ReduceOp,
    sum: ValueId,
    ty: &TensorType,
    size: usize,
) -> ValueId {
    if op != ReduceOp::Avg {
        return sum;
    }
    let count = push(g, Node::Constant(Literal::Float(size as f64)), ty.clone());
    push(g, Node::Binary(BinaryOp::Div, sum, count), ty.clone())
}

fn reduce_op(op: ReduceOp) -> ir::ReduceOp {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => ir::ReduceOp::Sum,
        ReduceOp::Min => ir::ReduceOp::Min,
        ReduceOp::Max => ir::ReduceOp::Max,
        ReduceOp::Prod => ir::ReduceOp::Prod,
    }
}
