//! A typed SSA IR of StableHLO-level operations: what ops build and what
//! `lower` prints. No I/O here.

use std::fmt;

use crate::dims::Dims;
use crate::dtype::DType;
use crate::sharding::Sharding;

/// A value: the index of the node that defines it in its graph.
pub type ValueId = usize;

/// The type of a value: a tensor of `dtype` with static `dims`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Dims,
}

impl TensorType {
    pub fn new(dtype: DType, dims: &[i64]) -> TensorType {
        TensorType {
            dtype,
            dims: Dims::from(dims),
        }
    }

    pub fn numel(&self) -> i64 {
        self.dims.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }
}

impl fmt::Display for TensorType {
    /// StableHLO's spelling: `tensor<2x3xf32>`, `tensor<f32>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype.mlir_name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Logistic,
    Abs,
    Sign,
    Floor,
    Ceil,
    RoundNearestEven,
    Not,
    Log1p,
    Expm1,
    Sin,
    Cos,
    Erf,
    Erfc,
    ErfInv,
    Lgamma,
    Digamma,
    Tan,
    Atan,
    Asin,
    Acos,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    /// A complex value's real part (the result has its component dtype).
    Real,
    /// A complex value's imaginary part (the result has its component dtype).
    Imag,
}

impl UnaryOp {
    pub fn mlir_name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "stablehlo.negate",
            UnaryOp::Exp => "stablehlo.exponential",
            UnaryOp::Log => "stablehlo.log",
            UnaryOp::Sqrt => "stablehlo.sqrt",
            UnaryOp::Rsqrt => "stablehlo.rsqrt",
            UnaryOp::Tanh => "stablehlo.tanh",
            UnaryOp::Logistic => "stablehlo.logistic",
            UnaryOp::Abs => "stablehlo.abs",
            UnaryOp::Sign => "stablehlo.sign",
            UnaryOp::Floor => "stablehlo.floor",
            UnaryOp::Ceil => "stablehlo.ceil",
            UnaryOp::RoundNearestEven => "stablehlo.round_nearest_even",
            UnaryOp::Not => "stablehlo.not",
            UnaryOp::Log1p => "stablehlo.log_plus_one",
            UnaryOp::Expm1 => "stablehlo.exponential_minus_one",
            UnaryOp::Sin => "stablehlo.sine",
            UnaryOp::Cos => "stablehlo.cosine",
            UnaryOp::Real => "stablehlo.real",
            UnaryOp::Imag => "stablehlo.imag",
            // CHLO ops: XLA legalises them to StableHLO when compiling.
            UnaryOp::Erf => "chlo.erf",
            UnaryOp::Erfc => "chlo.erfc",
            UnaryOp::Tan => "chlo.tan",
            UnaryOp::Atan => "chlo.atan",
            UnaryOp::Asin => "chlo.asin",
            UnaryOp::Acos => "chlo.acos",
            UnaryOp::Sinh => "chlo.sinh",
            UnaryOp::Cosh => "chlo.cosh",
            UnaryOp::Asinh => "chlo.asinh",
            UnaryOp::Acosh => "chlo.acosh",
            UnaryOp::Atanh => "chlo.atanh",
            UnaryOp::ErfInv => "chlo.erf_inv",
            UnaryOp::Lgamma => "chlo.lgamma",
            UnaryOp::Digamma => "chlo.digamma",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
    Max,
    Min,
    And,
    Or,
    Xor,
    Atan2,
    ShiftRightLogical,
    /// Real and imaginary parts into a complex value (the result's dtype is
    /// the complex one of its operands').
    Complex,
}

impl BinaryOp {
    pub fn mlir_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "stablehlo.add",
            BinaryOp::Sub => "stablehlo.subtract",
            BinaryOp::Mul => "stablehlo.multiply",
            BinaryOp::Div => "stablehlo.divide",
            BinaryOp::Rem => "stablehlo.remainder",
            BinaryOp::Pow => "stablehlo.power",
            BinaryOp::Max => "stablehlo.maximum",
            BinaryOp::Min => "stablehlo.minimum",
            BinaryOp::And => "stablehlo.and",
            BinaryOp::Or => "stablehlo.or",
            BinaryOp::Xor => "stablehlo.xor",
            BinaryOp::Atan2 => "stablehlo.atan2",
            BinaryOp::ShiftRightLogical => "stablehlo.shift_right_logical",
            BinaryOp::Complex => "stablehlo.complex",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareDir {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    And,
    Or,
}

/// A scalar literal, converted to the node's dtype when lowered.
#[derive(Clone, Copy, Debug)]
pub enum Literal {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Literal {
    /// The value as PyTorch casts a scalar to a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(x) => x,
            Literal::Int(x) => x as f64,
            Literal::Bool(x) => x as i64 as f64,
        }
    }
}

// Literals compare and hash by bits: graphs are cache keys, and two
// constants are the same program exactly when their bits are equal.
impl PartialEq for Literal {
    fn eq(&self, other: &Literal) -> bool {
        match (self, other) {
            (Literal::Float(a), Literal::Float(b)) => a.to_bits() == b.to_bits(),
            (Literal::Int(a), Literal::Int(b)) => a == b,
            (Literal::Bool(a), Literal::Bool(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Literal {}

impl std::hash::Hash for Literal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Literal::Float(v) => v.to_bits().hash(state),
            Literal::Int(v) => v.hash(state),
            Literal::Bool(v) => v.hash(state),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// The graph's `index`-th parameter.
    Param(usize),
    /// A literal broadcast to the node's type.
    Constant(Literal),
    /// Indices 0..n along `dim`.
    Iota {
        dim: usize,
    },
    /// Result dtype = operand dtype, except for `Real`, `Imag` (and `Abs`
    /// of a complex), which give the component dtype.
    Unary(UnaryOp, ValueId),
    /// Operands of equal type (result dtype = operand dtype, except for
    /// `Complex`).
    Binary(BinaryOp, ValueId, ValueId),
    /// Result is bool.
    Compare(CompareDir, ValueId, ValueId),
    Select {
        pred: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    },
    Convert(ValueId),
    BitcastConvert(ValueId),
    /// `stablehlo.broadcast_in_dim`: operand dim i goes to result dim `dims[i]`.
    Broadcast {
        operand: ValueId,
        dims: Vec<i64>,
    },
    Reshape(ValueId),
    /// `stablehlo.optimization_barrier`: the value as is, which XLA may not
    /// rewrite together with what computes or reads it.
    OptimizationBarrier(ValueId),
    Transpose {
        operand: ValueId,
        perm: Vec<i64>,
    },
    Slice {
        operand: ValueId,
        start: Vec<i64>,
        limit: Vec<i64>,
        strides: Vec<i64>,
    },
    Concat {
        operands: Vec<ValueId>,
        dim: usize,
    },
    Dot {
        lhs: ValueId,
        rhs: ValueId,
        lhs_batch: Vec<i64>,
        rhs_batch: Vec<i64>,
        lhs_contract: Vec<i64>,
        rhs_contract: Vec<i64>,
    },
    /// Reduces `dims` away with `op`'s identity as the initial value.
    Reduce {
        operand: ValueId,
        op: ReduceOp,
        dims: Vec<i64>,
    },
    /// `result[i...] = operand[indices[i...]]` for a 1-D operand and an s64
    /// index tensor of the result's shape.
    FlatGather {
        operand: ValueId,
        indices: ValueId,
    },
    /// `operand` (1-D) with `operand[indices[i...]] = updates[i...]`, or
    /// combined with `combine` (duplicates accumulate) when given.
    FlatScatter {
        combine: Option<ReduceOp>,
        operand: ValueId,
        indices: ValueId,
        updates: ValueId,
    },
    /// `size` elements of a 1-D `operand` from `start` (an s64 scalar
    /// value), so the position is an input, not part of the program.
    DynamicSlice {
        operand: ValueId,
        start: ValueId,
        size: i64,
    },
    /// A 1-D `operand` with 1-D `update` written from `start` (an s64
    /// scalar value).
    DynamicUpdateSlice {
        operand: ValueId,
        update: ValueId,
        start: ValueId,
    },
    /// `stablehlo.convolution`. Its window is boxed: inline, it made every
    /// node 200 bytes, and graphs move nodes around (most are elementwise).
    Convolution {
        lhs: ValueId,
        rhs: ValueId,
        window: Box<ConvWindow>,
    },
    /// Reverses the order of elements along `dims`.
    Reverse {
        operand: ValueId,
        dims: Vec<i64>,
    },
    /// Pads with the scalar `value` (a 0-d value): `low`/`high` per dim
    /// (negative crops), `interior` between elements.
    Pad {
        operand: ValueId,
        value: ValueId,
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<i64>,
    },
    /// Reduces sliding windows with `op` (its identity as the initial value
    /// and padding).
    ReduceWindow {
        operand: ValueId,
        op: ReduceOp,
        window: Vec<i64>,
        strides: Vec<i64>,
        padding: Vec<(i64, i64)>,
    },
    /// Sorts `keys` along `dim` (stable; floats as torch orders them: NaN the
    /// largest, -0.0 equal to 0.0), moving `payload` (same shape) with it;
    /// the node's value is the sorted keys.
    Sort {
        keys: ValueId,
        payload: ValueId,
        dim: i64,
        descending: bool,
    },
    /// The permuted payload of a `Sort` node.
    SortPayload {
        sort: ValueId,
    },
    /// Uniformly random unsigned bits of the node's type, from a `ui64[2]`
    /// Threefry key (the generator's seed and offset).
    RngBits {
        key: ValueId,
    },
    /// A collective across the replicas of a program: each replica's
    /// `operand` combined over its group. `groups` lists the replica ids that
    /// take part together (every replica in one group).
    Collective {
        op: CollectiveOp,
        operand: ValueId,
        groups: Vec<Vec<i64>>,
    },
    /// The replica's id, a `u32` scalar.
    ReplicaId,
}

/// How a `Collective` node combines its group's operands.
/// A convolution's layouts and window. Layouts name each operand's dims in
/// order: `b`/`f` (batch, feature) for the input and output, `o`/`i`
/// (output, input feature) for the kernel, digits for spatial dims, e.g.
/// `"bf01"`, `"oi01"`, `"bf01"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvWindow {
    pub layouts: [String; 3],
    pub window_strides: Vec<i64>,
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<i64>,
    pub rhs_dilation: Vec<i64>,
    pub feature_group_count: i64,
    pub batch_group_count: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// Every replica gets the operands combined with the op.
    AllReduce(ReduceOp),
    /// The operands concatenated along `dim`, in replica order.
    AllGather { dim: usize },
    /// The operands combined with `op`, then split along `dim`: replica k
    /// of the group gets the k-th piece.
    ReduceScatter { op: ReduceOp, dim: usize },
    /// Each operand split along `dim` into one piece per replica of the
    /// group; replica k gets the k-th piece of each, concatenated along
    /// `dim`.
    AllToAll { dim: usize },
}

/// Matches every node kind's operand fields, calling `$f` on each in a
/// fixed order: one list for the shared and the mutable visitor below
/// (match ergonomics bind the fields by reference of `$node`'s kind).
macro_rules! visit_operands {
    ($node:expr, $f:ident) => {
        match $node {
            Node::Param(_) | Node::Constant(_) | Node::Iota { .. } | Node::ReplicaId => {}
            Node::Unary(_, x)
            | Node::Convert(x)
            | Node::BitcastConvert(x)
            | Node::Reshape(x)
            | Node::OptimizationBarrier(x)
            | Node::Broadcast { operand: x, .. }
            | Node::Transpose { operand: x, .. }
            | Node::Slice { operand: x, .. }
            | Node::Reduce { operand: x, .. }
            | Node::Reverse { operand: x, .. }
            | Node::ReduceWindow { operand: x, .. }
            | Node::SortPayload { sort: x }
            | Node::RngBits { key: x }
            | Node::Collective { operand: x, .. } => $f(x),
            Node::Binary(_, x, y)
            | Node::Compare(_, x, y)
            | Node::Dot { lhs: x, rhs: y, .. }
            | Node::Convolution { lhs: x, rhs: y, .. }
            | Node::FlatGather {
                operand: x,
                indices: y,
            }
            | Node::DynamicSlice {
                operand: x,
                start: y,
                ..
            }
            | Node::Pad {
                operand: x,
                value: y,
                ..
            }
            | Node::Sort {
                keys: x,
                payload: y,
                ..
            } => {
                $f(x);
                $f(y);
            }
            Node::Select {
                pred,
                on_true,
                on_false,
            } => {
                $f(pred);
                $f(on_true);
                $f(on_false);
            }
            Node::FlatScatter {
                operand,
                indices,
                updates,
                ..
            } => {
                $f(operand);
                $f(indices);
                $f(updates);
            }
            Node::DynamicUpdateSlice {
                operand,
                update,
                start,
            } => {
                $f(operand);
                $f(update);
                $f(start);
            }
            Node::Concat { operands, .. } => {
                for x in operands {
                    $f(x);
                }
            }
        }
    };
}

impl Node {
    /// Calls `f` on every value the node reads, in a fixed order.
    pub fn for_each_operand_mut(&mut self, mut f: impl FnMut(&mut ValueId)) {
        visit_operands!(self, f)
    }

    /// Calls `f` on every value the node reads, in the same order.
    pub fn for_each_operand(&self, mut f: impl FnMut(ValueId)) {
        let mut read = |v: &ValueId| f(*v);
        visit_operands!(self, read)
    }
}

/// A parameter whose buffer the caller donates, and the output that holds
/// its new value: XLA writes that output into the donated memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Donor {
    pub param: usize,
    pub output: usize,
}

/// A function of typed parameters: nodes in definition order, outputs last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Graph {
    pub params: Vec<TensorType>,
    pub nodes: Vec<(Node, TensorType)>,
    pub outputs: Vec<ValueId>,
    /// Parameters whose buffers the caller donates, each with the output
    /// that overwrites it.
    pub donors: Vec<Donor>,
    /// Set for a program partitioned over the devices of a mesh.
    pub spmd: Option<Spmd>,
}

/// How an SPMD program's parameters and outputs are laid out over its
/// partitions; XLA propagates the layout of everything in between.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Spmd {
    /// The client device index each partition runs on.
    pub devices: Vec<usize>,
    /// One per parameter.
    pub params: Vec<Sharding>,
    /// One per output; None lets XLA choose.
    pub outputs: Vec<Option<Sharding>>,
}

impl Graph {
    pub fn ty(&self, value: ValueId) -> &TensorType {
        &self.nodes[value].1
    }

    /// The parameters whose buffers the caller donates.
    pub fn donated_params(&self) -> impl Iterator<Item = usize> + '_ {
        self.donors.iter().map(|d| d.param)
    }

    /// The graph restricted to what `outputs` need, with parameters renumbered;
    /// also returns the old index of each kept parameter. Consumes the graph,
    /// so its nodes are compacted in place rather than copied. `boundaries`
    /// (node counts, in order, such as where each recorded op's nodes end)
    /// are renumbered to count the kept nodes.
    pub fn prune(mut self, outputs: &[ValueId], boundaries: &mut [usize]) -> (Graph, Vec<usize>) {
        let n = self.nodes.len();
        let mut live = vec![false; n];
        for &o in outputs {
            live[o] = true;
        }
        for id in (0..n).rev() {
            if live[id] {
                self.nodes[id].0.for_each_operand(|v| live[v] = true);
            }
        }
        // Each node's id once the dead ones before it are gone (usize::MAX
        // for the dead), and the boundaries counted likewise.
        let mut new_id = vec![usize::MAX; n];
        let mut boundaries = boundaries.iter_mut().peekable();
        let mut kept = 0;
        for (id, &is_live) in live.iter().enumerate() {
            while let Some(end) = boundaries.next_if(|end| **end <= id) {
                *end = kept;
            }
            if is_live {
                new_id[id] = kept;
                kept += 1;
            }
        }
        for end in boundaries {
            *end = kept;
        }
        // Compacted in place: a node is large, and most survive.
        let mut kept_params = Vec::new();
        let mut id = 0;
        self.nodes.retain_mut(|(node, _)| {
            let is_live = live[id];
            id += 1;
            if is_live {
                match node {
                    Node::Param(i) => {
                        kept_params.push(*i);
                        *i = kept_params.len() - 1;
                    }
                    other => other.for_each_operand_mut(|v| *v = new_id[*v]),
                }
            }
            is_live
        });
        let pruned = Graph {
            params: kept_params
                .iter()
                .map(|&i| self.params[i].clone())
                .collect(),
            nodes: self.nodes,
            outputs: outputs.iter().map(|&o| new_id[o]).collect(),
            donors: Vec::new(),
            spmd: None,
        };
        (pruned, kept_params)
    }

    /// Reorders the nodes so that each follows the values it reads, for a
    /// graph rewritten to read values defined after it. Keeps the order of
    /// nodes that already follow their operands; parameter numbers stay.
    pub fn sort_operands_first(&mut self) {
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            Unvisited,
            OperandsPending,
            Placed,
        }
        let n = self.nodes.len();
        let mut state = vec![State::Unvisited; n];
        let mut new_id = vec![0; n];
        let mut placed = 0;
        let mut stack = Vec::new();
        for root in 0..n {
            stack.push(root);
            while let Some(&id) = stack.last() {
                match state[id] {
                    State::Unvisited => {
                        state[id] = State::OperandsPending;
                        let mut operands = Vec::new();
                        self.nodes[id].0.for_each_operand(|v| operands.push(v));
                        // Reversed, so the first operand is placed first. A
                        // pending operand would be a cycle: none is made.
                        let unvisited = operands
                            .into_iter()
                            .rev()
                            .filter(|&v| state[v] == State::Unvisited);
                        stack.extend(unvisited);
                    }
                    State::OperandsPending => {
                        state[id] = State::Placed;
                        new_id[id] = placed;
                        placed += 1;
                        stack.pop();
                    }
                    State::Placed => {
                        stack.pop();
                    }
                }
            }
        }
        let mut nodes: Vec<(usize, (Node, TensorType))> = std::mem::take(&mut self.nodes)
            .into_iter()
            .enumerate()
            .collect();
        nodes.sort_unstable_by_key(|&(id, _)| new_id[id]);
        self.nodes = nodes
            .into_iter()
            .map(|(_, (mut node, ty))| {
                node.for_each_operand_mut(|v| *v = new_id[*v]);
                (node, ty)
            })
            .collect();
        for output in &mut self.outputs {
            *output = new_id[*output];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_operands_first_places_values_read_before_they_were_defined() {
        let f32x2 = TensorType::new(DType::F32, &[2]);
        // Node 1 reads node 3, defined after it.
        let mut graph = Graph {
            params: vec![f32x2.clone()],
            nodes: vec![
                (Node::Param(0), f32x2.clone()),
                (Node::Binary(BinaryOp::Add, 0, 3), f32x2.clone()),
                (Node::Unary(UnaryOp::Neg, 0), f32x2.clone()),
                (Node::Unary(UnaryOp::Tanh, 2), f32x2.clone()),
            ],
            outputs: vec![1, 3],
            donors: Vec::new(),
            spmd: None,
        };
        graph.sort_operands_first();
        let want = vec![
            (Node::Param(0), f32x2.clone()),
            (Node::Unary(UnaryOp::Neg, 0), f32x2.clone()),
            (Node::Unary(UnaryOp::Tanh, 1), f32x2.clone()),
            (Node::Binary(BinaryOp::Add, 0, 2), f32x2),
        ];
        assert_eq!(graph.nodes, want);
        assert_eq!(graph.outputs, vec![3, 2]);

        // A graph already in order keeps it.
        let before = graph.clone();
        graph.sort_operands_first();
        assert_eq!(graph, before);
    }

    #[test]
    fn prune_keeps_what_the_outputs_read_and_renumbers_op_boundaries() {
        let f32x2 = TensorType::new(DType::F32, &[2]);
        // Three ops: exp of parameter 0 (unused), neg of parameter 1, tanh
        // of the neg; only the tanh is an output.
        let graph = Graph {
            params: vec![f32x2.clone(), f32x2.clone()],
            nodes: vec![
                (Node::Param(0), f32x2.clone()),
                (Node::Unary(UnaryOp::Exp, 0), f32x2.clone()),
                (Node::Param(1), f32x2.clone()),
                (Node::Unary(UnaryOp::Neg, 2), f32x2.clone()),
                (Node::Unary(UnaryOp::Tanh, 3), f32x2.clone()),
            ],
            outputs: Vec::new(),
            donors: Vec::new(),
            spmd: None,
        };
        let mut op_ends = [2, 4, 5];
        let (pruned, kept) = graph.prune(&[4], &mut op_ends);
        assert_eq!(kept, vec![1]);
        assert_eq!(pruned.params, vec![f32x2.clone()]);
        let want = vec![
            (Node::Param(0), f32x2.clone()),
            (Node::Unary(UnaryOp::Neg, 0), f32x2.clone()),
            (Node::Unary(UnaryOp::Tanh, 1), f32x2),
        ];
        assert_eq!(pruned.nodes, want);
        assert_eq!(pruned.outputs, vec![2]);
        // The first op kept nothing: it ends where the pruned graph starts.
        assert_eq!(op_ends, [0, 2, 3]);
    }
}
