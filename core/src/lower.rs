//! Lowering: `ir::Graph` → StableHLO text (MLIR generic form, which reads the
//! same for every op). A pure function, tested against golden text.

use std::fmt::Write;

use half::{bf16, f16};

use crate::dtype::DType;
use crate::ir::{CollectiveOp, CompareDir, ConvWindow, Graph, Literal, Node, ReduceOp, TensorType};
use crate::sharding::Sharding;

/// The module text for `graph`, with `@main` as its entry.
pub fn lower(graph: &Graph) -> String {
    let mut out = String::with_capacity(256 + 96 * graph.nodes.len());
    // Parameters are named after the `Param` node that stands for them, so
    // every value prints as %v<node>.
    let mut param_nodes = vec![None; graph.params.len()];
    for (id, (node, _)) in graph.nodes.iter().enumerate() {
        if let Node::Param(i) = node {
            param_nodes[*i] = Some(id);
        }
    }
    out.push_str("module @rtpu ");
    if let Some(spmd) = &graph.spmd {
        let _ = write!(
            out,
            "attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = 1 : i32}} ",
            spmd.devices.len()
        );
    }
    out.push_str("{\n  func.func public @main(");
    for (i, ty) in graph.params.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        match param_nodes[i] {
            Some(id) => {
                let _ = write!(out, "%v{id}: {ty}");
            }
            None => {
                let _ = write!(out, "%unused{i}: {ty}");
            }
        }
        let mut attributes = Vec::new();
        if let Some(donor) = graph.donors.iter().find(|d| d.param == i) {
            // Naming the output that overwrites the buffer: a bare donor
            // lets XLA pair it with any output of its type (a momentum
            // buffer with the gradient that updates it), and the wrong
            // pairing costs a copy of both. An output stored unlike its
            // parameter (in other dims, or split otherwise over an SPMD
            // program's devices) can only take a bare donor's buffer.
            let output = graph.outputs[donor.output];
            let stored_alike = graph.ty(output) == ty
                && graph.spmd.as_ref().is_none_or(|spmd| {
                    spmd.outputs[donor.output].as_ref() == Some(&spmd.params[i])
                });
            attributes.push(match stored_alike {
                true => format!("tf.aliasing_output = {} : i32", donor.output),
                false => "jax.buffer_donor = true".to_string(),
            });
        }
        if let Some(spmd) = &graph.spmd {
            attributes.push(sharding_attribute(&spmd.params[i], spmd.devices.len()));
        }
        if !attributes.is_empty() {
            let _ = write!(out, " {{{}}}", attributes.join(", "));
        }
    }
    out.push_str(") -> (");
    for (i, &v) in graph.outputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}", graph.ty(v));
        let chosen = graph
            .spmd
            .as_ref()
            .and_then(|s| Some((s.outputs[i].as_ref()?, s)));
        if let Some((sharding, spmd)) = chosen {
            let _ = write!(
                out,
                " {{{}}}",
                sharding_attribute(sharding, spmd.devices.len())
            );
        }
    }
    out.push_str(") {\n");
    for (id, (node, ty)) in graph.nodes.iter().enumerate() {
        lower_node(&mut out, graph, id, node, ty);
    }
    out.push_str("    \"func.return\"(");
    push_values(&mut out, &graph.outputs);
    out.push_str(") : (");
    for (i, &v) in graph.outputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}", graph.ty(v));
    }
    out.push_str(") -> ()\n  }\n}\n");
    out
}

fn push_values(out: &mut String, values: &[usize]) {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "%v{v}");
    }
}

fn i64_array(values: &[i64]) -> String {
    if values.is_empty() {
        return "array<i64>".to_string();
    }
    let items: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("array<i64: {}>", items.join(", "))
}

fn i64_list(values: &[i64]) -> String {
    let items: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// `%vN = "op"(operands) {attrs} : (operand types) -> result type`.
fn op(
    out: &mut String,
    graph: &Graph,
    id: usize,
    name: &str,
    operands: &[usize],
    attrs: &str,
    ty: &TensorType,
) {
    let _ = write!(out, "    %v{id} = \"{name}\"(");
    push_values(out, operands);
    out.push(')');
    if !attrs.is_empty() {
        let _ = write!(out, " {{{attrs}}}");
    }
    out.push_str(" : (");
    for (i, &v) in operands.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}", graph.ty(v));
    }
    let _ = writeln!(out, ") -> {ty}");
}

fn sharding_attribute(sharding: &Sharding, partitions: usize) -> String {
    format!("mhlo.sharding = \"{}\"", sharding.to_hlo_text(partitions))
}

/// The literal as a dense attribute element of `dtype`, exact for every
/// dtype (floats as hex bit patterns, so inf/nan and rounding are exact).
pub fn literal_attr(literal: Literal, dtype: DType) -> String {
    let as_f64 = literal.as_f64();
    let as_i128 = match literal {
        Literal::Float(x) => x as i128,
        Literal::Int(x) => x as i128,
        Literal::Bool(x) => x as i128,
    };
    match dtype {
        DType::Bool => (if as_f64 != 0.0 { "true" } else { "false" }).to_string(),
        DType::I8 => (as_i128 as i8).to_string(),
        DType::I16 => (as_i128 as i16).to_string(),
        DType::I32 => (as_i128 as i32).to_string(),
        DType::I64 => (as_i128 as i64).to_string(),
        DType::U8 => (as_i128 as u8).to_string(),
        DType::U16 => (as_i128 as u16).to_string(),
        DType::U32 => (as_i128 as u32).to_string(),
        DType::U64 => (as_i128 as u64).to_string(),
        DType::F16 => format!("0x{:04X}", f16::from_f64(as_f64).to_bits()),
        DType::BF16 => format!("0x{:04X}", bf16::from_f64(as_f64).to_bits()),
        DType::F32 => format!("0x{:08X}", (as_f64 as f32).to_bits()),
        DType::F64 => format!("0x{:016X}", as_f64.to_bits()),
        DType::C64 => format!("(0x{:08X}, 0x00000000)", (as_f64 as f32).to_bits()),
        DType::C128 => format!("(0x{:016X}, 0x0000000000000000)", as_f64.to_bits()),
    }
}

fn reduce_combiner(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "stablehlo.add",
        ReduceOp::Prod => "stablehlo.multiply",
        ReduceOp::Max => "stablehlo.maximum",
        ReduceOp::Min => "stablehlo.minimum",
        ReduceOp::And => "stablehlo.and",
        ReduceOp::Or => "stablehlo.or",
    }
}

/// The region that combines two scalars of `dtype` with `op`, as reduce
/// and the reducing collectives take it.
fn combiner_region(op: ReduceOp, dtype: DType) -> String {
    let scalar = TensorType::new(dtype, &[]);
    format!(
        "{{\n    ^bb0(%a: {scalar}, %b: {scalar}):\n      \
         %r = \"{}\"(%a, %b) : ({scalar}, {scalar}) -> {scalar}\n      \
         \"stablehlo.return\"(%r) : ({scalar}) -> ()\n    }}",
        reduce_combiner(op)
    )
}

/// A collective that combines with `reduce`, whose `attrs` end with its
/// replica groups.
#[allow(clippy::too_many_arguments)]
fn reducing_collective(
    out: &mut String,
    graph: &Graph,
    id: usize,
    name: &str,
    operand: usize,
    reduce: ReduceOp,
    attrs: &str,
    ty: &TensorType,
) {
    let region = combiner_region(reduce, ty.dtype);
    let _ = writeln!(
        out,
        "    %v{id} = \"stablehlo.{name}\"(%v{operand}) ({region}) {{{attrs}}} : ({}) -> {ty}",
        graph.ty(operand)
    );
}

/// `replica_groups` as a dense attribute: one row per group.
fn replica_groups(groups: &[Vec<i64>]) -> String {
    let width = groups.first().map_or(0, Vec::len);
    let rows: Vec<String> = groups
        .iter()
        .map(|g| {
            let ids: Vec<String> = g.iter().map(i64::to_string).collect();
            format!("[{}]", ids.join(", "))
        })
        .collect();
    format!(
        "dense<[{}]> : tensor<{}x{width}xi64>",
        rows.join(", "),
        groups.len()
    )
}

fn reduce_identity(op: ReduceOp, dtype: DType) -> Literal {
    let float = matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    match op {
        ReduceOp::Sum | ReduceOp::Or => Literal::Int(0),
        ReduceOp::Prod | ReduceOp::And => Literal::Int(1),
        ReduceOp::Max if dtype == DType::Bool => Literal::Bool(false),
        ReduceOp::Min if dtype == DType::Bool => Literal::Bool(true),
        ReduceOp::Max if float => Literal::Float(f64::NEG_INFINITY),
        ReduceOp::Min if float => Literal::Float(f64::INFINITY),
        ReduceOp::Max => Literal::Int(integer_bounds(dtype).0),
        ReduceOp::Min => Literal::Int(integer_bounds(dtype).1),
    }
}

/// (min, max) of an integer dtype, saturated to i64.
fn integer_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        // u64's max does not fit; -1 reinterprets as it (literal_attr wraps).
        DType::U64 => (0, -1),
        _ => (i64::MIN, i64::MAX),
    }
}

fn compare_attrs(dir: CompareDir, dtype: DType) -> String {
    let direction = match dir {
        CompareDir::Eq => "EQ",
        CompareDir::Ne => "NE",
        CompareDir::Lt => "LT",
        CompareDir::Le => "LE",
        CompareDir::Gt => "GT",
        CompareDir::Ge => "GE",
    };
    let kind = match dtype {
        // Complex values compare (EQ/NE only) as FLOAT, as XLA expects.
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::C64 | DType::C128 => "FLOAT",
        DType::Bool | DType::U8 | DType::U16 | DType::U32 | DType::U64 => "UNSIGNED",
        _ => "SIGNED",
    };
    format!(
        "comparison_direction = #stablehlo<comparison_direction {direction}>, compare_type = #stablehlo<comparison_type {kind}>"
    )
}

/// The body of a sort's comparator: whether `%a` goes before `%b`.
///
/// Floats order as torch.sort does: NaN (of either sign) above everything,
/// and -0.0 equal to 0.0, so the stable sort keeps them in input order.
/// (TOTALORDER would put -0.0 first and a negative NaN, which x86 makes
/// for 0/0, below -inf.)
fn sort_comparator(dtype: DType, descending: bool) -> String {
    let ks = TensorType::new(dtype, &[]);
    let compare = |x: &str, y: &str, dir: &str, kind: &str| {
        format!(
            "\"stablehlo.compare\"(%{x}, %{y}) {{comparison_direction = #stablehlo<comparison_direction {dir}>, \
             compare_type = #stablehlo<comparison_type {kind}>}} : ({ks}, {ks}) -> tensor<i1>"
        )
    };
    let ret = "      \"stablehlo.return\"(%r) : (tensor<i1>) -> ()\n";
    let direction = if descending { "GT" } else { "LT" };
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
        let kind = if matches!(
            dtype,
            DType::Bool | DType::U8 | DType::U16 | DType::U32 | DType::U64
        ) {
            "UNSIGNED"
        } else {
            "SIGNED"
        };
        return format!("      %r = {}\n{ret}", compare("a", "b", direction, kind));
    }
    // Ascending: a < b, or only b is NaN; descending: a > b, or only a is.
    let (nan, number) = if descending { ("a", "b") } else { ("b", "a") };
    let i1 = "(tensor<i1>, tensor<i1>) -> tensor<i1>";
    format!(
        "      %ordered = {}\n      \
         %nan = {}\n      \
         %number = {}\n      \
         %nan_largest = \"stablehlo.and\"(%nan, %number) : {i1}\n      \
         %r = \"stablehlo.or\"(%ordered, %nan_largest) : {i1}\n{ret}",
        compare("a", "b", direction, "FLOAT"),
        compare(nan, nan, "NE", "FLOAT"),
        compare(number, number, "EQ", "FLOAT"),
    )
}

fn lower_node(out: &mut String, graph: &Graph, id: usize, node: &Node, ty: &TensorType) {
    match node {
        Node::Param(_) => {}
        Node::Constant(literal) => {
            let _ = writeln!(
                out,
                "    %v{id} = \"stablehlo.constant\"() {{value = dense<{}> : {ty}}} : () -> {ty}",
                literal_attr(*literal, ty.dtype)
            );
        }
        Node::Iota { dim } => {
            let _ = writeln!(out, "    %v{id} = \"stablehlo.iota\"() {{iota_dimension = {dim} : i64}} : () -> {ty}");
        }
        Node::Unary(u, x) => op(out, graph, id, u.mlir_name(), &[*x], "", ty),
        Node::Binary(b, x, y) => op(out, graph, id, b.mlir_name(), &[*x, *y], "", ty),
        Node::Compare(dir, x, y) => op(out, graph, id, "stablehlo.compare", &[*x, *y], &compare_attrs(*dir, graph.ty(*x).dtype), ty),
        Node::Select { pred, on_true, on_false } => op(out, graph, id, "stablehlo.select", &[*pred, *on_true, *on_false], "", ty),
        Node::Convert(x) => op(out, graph, id, "stablehlo.convert", &[*x], "", ty),
        Node::BitcastConvert(x) => op(out, graph, id, "stablehlo.bitcast_convert", &[*x], "", ty),
        Node::Broadcast { operand, dims } => op(
            out,
            graph,
            id,
            "stablehlo.broadcast_in_dim",
            &[*operand],
            &format!("broadcast_dimensions = {}", i64_array(dims)),
            ty,
        ),
        Node::Reshape(x) => op(out, graph, id, "stablehlo.reshape", &[*x], "", ty),
        Node::OptimizationBarrier(x) => op(out, graph, id, "stablehlo.optimization_barrier", &[*x], "", ty),
        Node::Transpose { operand, perm } => {
            op(out, graph, id, "stablehlo.transpose", &[*operand], &format!("permutation = {}", i64_array(perm)), ty)
        }
        Node::Slice { operand, start, limit, strides } => op(
            out,
            graph,
            id,
            "stablehlo.slice",
            &[*operand],
            &format!(
                "start_indices = {}, limit_indices = {}, strides = {}",
                i64_array(start),
                i64_array(limit),
                i64_array(strides)
            ),
            ty,
        ),
        Node::Concat { operands, dim } => {
            op(out, graph, id, "stablehlo.concatenate", operands, &format!("dimension = {dim} : i64"), ty)
        }
        Node::Dot { lhs, rhs, lhs_batch, rhs_batch, lhs_contract, rhs_contract } => op(
            out,
            graph,
            id,
            "stablehlo.dot_general",
            &[*lhs, *rhs],
            &format!(
                "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, \
                 lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>",
                i64_list(lhs_batch),
                i64_list(rhs_batch),
                i64_list(lhs_contract),
                i64_list(rhs_contract)
            ),
            ty,
        ),
        Node::Reduce { operand, op: reduce, dims } => {
            let scalar = TensorType::new(ty.dtype, &[]);
            let region = combiner_region(*reduce, ty.dtype);
            let init = literal_attr(reduce_identity(*reduce, ty.dtype), ty.dtype);
            let operand_ty = graph.ty(*operand);
            let _ = writeln!(
                out,
                "    %v{id}_init = \"stablehlo.constant\"() {{value = dense<{init}> : {scalar}}} : () -> {scalar}\n    \
                 %v{id} = \"stablehlo.reduce\"(%v{operand}, %v{id}_init) ({region}) \
                 {{dimensions = {}}} : ({operand_ty}, {scalar}) -> {ty}",
                i64_array(dims)
            );
        }
        Node::Collective {
            op: collective,
            operand,
            groups,
        } => {
            let groups_attr = format!("replica_groups = {}", replica_groups(groups));
            match *collective {
                CollectiveOp::AllReduce(reduce) => {
                    reducing_collective(out, graph, id, "all_reduce", *operand, reduce, &groups_attr, ty)
                }
                CollectiveOp::ReduceScatter { op: reduce, dim } => reducing_collective(
                    out,
                    graph,
                    id,
                    "reduce_scatter",
                    *operand,
                    reduce,
                    &format!("scatter_dimension = {dim} : i64, {groups_attr}"),
                    ty,
                ),
                CollectiveOp::AllGather { dim } => {
                    let attrs = format!("all_gather_dim = {dim} : i64, {groups_attr}");
                    op(out, graph, id, "stablehlo.all_gather", &[*operand], &attrs, ty)
                }
                CollectiveOp::AllToAll { dim } => {
                    let attrs = format!(
                        "split_dimension = {dim} : i64, concat_dimension = {dim} : i64, \
                         split_count = {} : i64, {groups_attr}",
                        groups.first().map_or(1, Vec::len),
                    );
                    op(out, graph, id, "stablehlo.all_to_all", &[*operand], &attrs, ty)
                }
            }
        }
        Node::ReplicaId => op(out, graph, id, "stablehlo.replica_id", &[], "", ty),
        Node::FlatGather { operand, indices } => {
            let rank = graph.ty(*indices).rank();
            op(
                out,
                graph,
                id,
                "stablehlo.gather",
                &[*operand, *indices],
                &format!(
                    "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], \
                     index_vector_dim = {rank}>, slice_sizes = array<i64: 1>, indices_are_sorted = false"
                ),
                ty,
            )
        }
        Node::FlatScatter { combine, operand, indices, updates } => {
            let rank = graph.ty(*indices).rank();
            let scalar = TensorType::new(ty.dtype, &[]);
            let combine = match combine {
                Some(op) => format!(
                    "%sum = \"{}\"(%old, %new) : ({scalar}, {scalar}) -> {scalar}\n      \"stablehlo.return\"(%sum)",
                    reduce_combiner(*op)
                ),
                None => "\"stablehlo.return\"(%new)".to_string(),
            };
            let _ = writeln!(
                out,
                "    %v{id} = \"stablehlo.scatter\"(%v{operand}, %v{indices}, %v{updates}) ({{\n    \
                 ^bb0(%old: {scalar}, %new: {scalar}):\n      \
                 {combine} : ({scalar}) -> ()\n    \
                 }}) {{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], \
                 scatter_dims_to_operand_dims = [0], index_vector_dim = {rank}>, indices_are_sorted = false, \
                 unique_indices = false}} : ({}, {}, {}) -> {ty}",
                graph.ty(*operand),
                graph.ty(*indices),
                graph.ty(*updates)
            );
        }
        Node::DynamicSlice { operand, start, size } => {
            let _ = writeln!(
                out,
                "    %v{id} = \"stablehlo.dynamic_slice\"(%v{operand}, %v{start}) {{slice_sizes = {}}} : ({}, {}) -> {ty}",
                i64_array(&[*size]),
                graph.ty(*operand),
                graph.ty(*start),
            );
        }
        Node::DynamicUpdateSlice { operand, update, start } => {
            let _ = writeln!(
                out,
                "    %v{id} = \"stablehlo.dynamic_update_slice\"(%v{operand}, %v{update}, %v{start}) : ({}, {}, {}) -> {ty}",
                graph.ty(*operand),
                graph.ty(*update),
                graph.ty(*start),
            );
        }
        Node::Convolution { lhs, rhs, window } => {
            let ConvWindow {
                layouts,
                window_strides,
                padding,
                lhs_dilation,
                rhs_dilation,
                feature_group_count,
                batch_group_count,
            } = &**window;
            let spec = |layout: &str| {
                let items: Vec<String> = layout.chars().map(|c| c.to_string()).collect();
                format!("[{}]", items.join(", "))
            };
            let pads: Vec<String> = padding.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect();
            let padding_attr = if padding.is_empty() {
                "dense<> : tensor<0x2xi64>".to_string()
            } else {
                format!("dense<[{}]> : tensor<{}x2xi64>", pads.join(", "), padding.len())
            };
            op(
                out,
                graph,
                id,
                "stablehlo.convolution",
                &[*lhs, *rhs],
                &format!(
                    "batch_group_count = {batch_group_count} : i64, dimension_numbers = #stablehlo.conv<{}x{}->{}>, \
                     feature_group_count = {feature_group_count} : i64, lhs_dilation = {}, padding = {padding_attr}, \
                     rhs_dilation = {}, window_strides = {}",
                    spec(&layouts[0]),
                    spec(&layouts[1]),
                    spec(&layouts[2]),
                    i64_array(lhs_dilation),
                    i64_array(rhs_dilation),
                    i64_array(window_strides)
                ),
                ty,
            )
        }
        Node::Reverse { operand, dims } => {
            op(out, graph, id, "stablehlo.reverse", &[*operand], &format!("dimensions = {}", i64_array(dims)), ty)
        }
        Node::Pad { operand, value, low, high, interior } => op(
            out,
            graph,
            id,
            "stablehlo.pad",
            &[*operand, *value],
            &format!(
                "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                i64_array(low),
                i64_array(high),
                i64_array(interior)
            ),
            ty,
        ),
        Node::ReduceWindow { operand, op: reduce, window, strides, padding } => {
            let scalar = TensorType::new(ty.dtype, &[]);
            let init = literal_attr(reduce_identity(*reduce, ty.dtype), ty.dtype);
            let pads: Vec<String> = padding.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect();
            let _ = writeln!(
                out,
                "    %v{id}_init = \"stablehlo.constant\"() {{value = dense<{init}> : {scalar}}} : () -> {scalar}\n    \
                 %v{id} = \"stablehlo.reduce_window\"(%v{operand}, %v{id}_init) ({{\n    \
                 ^bb0(%a: {scalar}, %b: {scalar}):\n      \
                 %r = \"{}\"(%a, %b) : ({scalar}, {scalar}) -> {scalar}\n      \
                 \"stablehlo.return\"(%r) : ({scalar}) -> ()\n    \
                 }}) {{window_dimensions = {}, window_strides = {}, padding = dense<[{}]> : tensor<{}x2xi64>}} : ({}, {scalar}) -> {ty}",
                reduce_combiner(*reduce),
                i64_array(window),
                i64_array(strides),
                pads.join(", "),
                padding.len(),
                graph.ty(*operand),
            );
        }
        Node::Sort { keys, payload, dim, descending } => {
            let key_ty = graph.ty(*keys);
            let payload_ty = graph.ty(*payload);
            let ks = TensorType::new(key_ty.dtype, &[]);
            let ps = TensorType::new(payload_ty.dtype, &[]);
            let _ = writeln!(
                out,
                "    %v{id}, %v{id}_payload = \"stablehlo.sort\"(%v{keys}, %v{payload}) ({{\n    \
                 ^bb0(%a: {ks}, %b: {ks}, %c: {ps}, %d: {ps}):\n{}    \
                 }}) {{dimension = {dim} : i64, is_stable = true}} : ({key_ty}, {payload_ty}) -> ({key_ty}, {payload_ty})",
                sort_comparator(key_ty.dtype, *descending)
            );
        }
        Node::SortPayload { sort } => {
            // A same-shape reshape names the sort's second result as a value.
            let _ = writeln!(out, "    %v{id} = \"stablehlo.reshape\"(%v{sort}_payload) : ({ty}) -> {ty}");
        }
        Node::RngBits { key } => {
            let key_ty = graph.ty(*key);
            let _ = writeln!(
                out,
                "    %v{id}_state, %v{id} = \"stablehlo.rng_bit_generator\"(%v{key}) {{rng_algorithm = \
                 #stablehlo<rng_algorithm THREE_FRY>}} : ({key_ty}) -> ({key_ty}, {ty})"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Donor, UnaryOp};

    #[test]
    fn golden_add_then_tanh() {
        let f32x2 = TensorType::new(DType::F32, &[2]);
        let graph = Graph {
            params: vec![f32x2.clone(), f32x2.clone()],
            nodes: vec![
                (Node::Param(0), f32x2.clone()),
                (Node::Param(1), f32x2.clone()),
                (Node::Binary(BinaryOp::Add, 0, 1), f32x2.clone()),
                (Node::Constant(Literal::Float(0.5)), f32x2.clone()),
                (Node::Binary(BinaryOp::Mul, 2, 3), f32x2.clone()),
                (Node::Unary(UnaryOp::Tanh, 4), f32x2.clone()),
            ],
            outputs: vec![5],
            donors: vec![Donor {
                param: 1,
                output: 0,
            }],
            spmd: None,
        };
        let want = r#"module @rtpu {
  func.func public @main(%v0: tensor<2xf32>, %v1: tensor<2xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<2xf32>) {
    %v2 = "stablehlo.add"(%v0, %v1) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %v3 = "stablehlo.constant"() {value = dense<0x3F000000> : tensor<2xf32>} : () -> tensor<2xf32>
    %v4 = "stablehlo.multiply"(%v2, %v3) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %v5 = "stablehlo.tanh"(%v4) : (tensor<2xf32>) -> tensor<2xf32>
    "func.return"(%v5) : (tensor<2xf32>) -> ()
  }
}
"#;
        assert_eq!(lower(&graph), want);
    }

    #[test]
    fn literals_are_exact_per_dtype() {
        assert_eq!(literal_attr(Literal::Float(1.0), DType::BF16), "0x3F80");
        assert_eq!(
            literal_attr(Literal::Float(f64::NEG_INFINITY), DType::F32),
            "0xFF800000"
        );
        assert_eq!(literal_attr(Literal::Int(-1), DType::U8), "255");
        assert_eq!(literal_attr(Literal::Int(3), DType::Bool), "true");
    }
}
