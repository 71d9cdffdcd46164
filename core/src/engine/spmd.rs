//! SPMD programs: a pending graph that reads a sharded storage runs as one
//! program partitioned over the devices of its mesh. Sharded inputs keep
//! their layouts, every other input is replicated, storages the graph
//! overwrites keep theirs, and XLA chooses (and says) the layout of every
//! other output, so a step's new values stay split as XLA computed them.

use std::sync::Arc;
use std::time::Instant;

use super::launch::Source;
use super::{cache, host_input, work};
use crate::error::{Error, Result};
use crate::ir::{Graph, Node, Spmd, TensorType, ValueId};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client, Execution};
use crate::sharding::Sharding;
use crate::storage::{Shards, Storage, StorageValue};

/// The mesh devices of the sharded sources among `kept`, or None when no
/// source is sharded. Two meshes in one program are an error.
pub(super) fn mesh_of(kept: &[usize], sources: &[Source]) -> Result<Option<Vec<usize>>> {
    let mut mesh: Option<&Vec<usize>> = None;
    for &p in kept {
        if let Source::Sharded(shards) = &sources[p] {
            match mesh {
                Some(devices) if *devices != shards.devices => {
                    return Err(Error::invalid(
                        "the sharded tensors of one program",
                        format!("one mesh (devices {devices:?})"),
                        format!("another mesh (devices {:?})", shards.devices),
                    ))
                }
                _ => mesh = Some(&shards.devices),
            }
        }
    }
    Ok(mesh.cloned())
}

/// A pending graph to run over a mesh: the pruned graph, whose parameter
/// `i` reads `sources[kept[i]]`.
pub(super) struct Run<'a> {
    pub mesh: &'a [usize],
    pub graph: &'a Graph,
    pub kept: &'a [usize],
    pub sources: &'a [Source],
}

impl Run<'_> {
    /// Runs it. `layouts[o]` is the sharded value the graph's `o`-th
    /// output overwrites (that output keeps its layout); `read_only` lists
    /// (source index, storage) of the storages the graph only read, which
    /// keep the copies made on the mesh. Returns each output's value.
    pub fn run(
        &self,
        client: &Client,
        mut layouts: Vec<Option<Arc<Shards>>>,
        read_only: Vec<(usize, Arc<Storage>)>,
        provenance: Option<&cache::Provenance<'_>>,
    ) -> Result<Vec<Computed>> {
        layouts.resize(self.graph.outputs.len(), None);
        let ran = execute(
            client,
            self.mesh,
            self.graph,
            self.kept,
            self.sources,
            &layouts,
            provenance,
        )?;
        keep_on_mesh(self, &read_only, ran.replicated);
        Ok(ran.outputs.into_iter().map(Computed::Sharded).collect())
    }
}

/// What an SPMD program's run left.
struct Ran {
    /// Each output's shards.
    outputs: Vec<Shards>,
    /// For each parameter read from one device's buffer: its index and
    /// the copy each partition read (by partition), which can stand for
    /// the storage on the mesh from now on.
    replicated: Vec<(usize, Vec<Arc<Buffer>>)>,
}

/// Runs `graph` (pruned; parameter `i` read from `sources[kept[i]]`) over
/// the `mesh` devices. `layouts[o]` is the value output `o` overwrites when
/// that value was sharded: the output keeps its layout.
fn execute(
    client: &Client,
    mesh: &[usize],
    graph: &Graph,
    kept: &[usize],
    sources: &[Source],
    layouts: &[Option<Arc<Shards>>],
    provenance: Option<&cache::Provenance<'_>>,
) -> Result<Ran> {
    let (program, output_dims) = partitioned(graph, mesh, kept, sources, layouts);
    let exe = cache::executable(client, mesh[0], &program, provenance)?;
    let shardings = exe.output_shardings().ok_or_else(|| {
        Error::invalid(
            "an SPMD program",
            "the layout of its outputs from the plugin",
            "a plugin that does not say",
        )
    })?;
    // The executable's devices in the order it takes arguments, and the
    // partition each runs.
    let ids = mesh
        .iter()
        .map(|&d| client.device(d)?.id())
        .collect::<Result<Vec<i32>>>()?;
    let partition_of = exe
        .devices()
        .iter()
        .map(|device| {
            let id = device.id()?;
            ids.iter()
                .position(|&i| i == id)
                .ok_or_else(|| Error::invalid("an SPMD program's devices", format!("{ids:?}"), id))
        })
        .collect::<Result<Vec<usize>>>()?;
    let mut rows = Vec::with_capacity(mesh.len());
    for &partition in &partition_of {
        rows.push(arguments(
            client,
            mesh[partition],
            partition,
            kept,
            sources,
        )?);
    }
    let replicated = (0..kept.len())
        .filter(|&i| matches!(sources[kept[i]], Source::Buffer(_)))
        .map(|i| {
            let mut by_partition = vec![None; mesh.len()];
            for (row, &partition) in rows.iter().zip(&partition_of) {
                by_partition[partition] = Some(row[i].clone());
            }
            (i, by_partition.into_iter().flatten().collect())
        })
        .collect();
    let mut donated: Vec<Vec<Arc<Buffer>>> = rows
        .iter()
        .map(|row| program.donated_params().map(|p| row[p].clone()).collect())
        .collect();
    let rows: Vec<&[Arc<Buffer>]> = rows.iter().map(Vec::as_slice).collect();
    let start = Instant::now();
    let donate: Vec<usize> = program.donated_params().collect();
    let results = exe.execute_with_events(&rows, &donate);
    metrics::add_elapsed(Metric::ExecuteNs, start);
    metrics::add(Metric::GraphExecutions, 1);
    metrics::add(Metric::SpmdExecutions, 1);
    let moved = exe.collectives().map_or(0, |c| c.result_bytes);
    metrics::add(Metric::SpmdCollectiveBytes, moved);
    metrics::add(
        Metric::BuffersDonated,
        (program.donors.len() * mesh.len()) as u64,
    );
    let Execution {
        outputs: results,
        finished,
    } = results?;
    let mut finished = finished.into_iter();
    let mut by_partition: Vec<Vec<Option<Buffer>>> = (0..mesh.len()).map(|_| Vec::new()).collect();
    for ((device_results, &partition), donated) in results
        .into_iter()
        .zip(&partition_of)
        .zip(donated.iter_mut())
    {
        if let Some(Some(ready)) = finished.next() {
            work::launched(client, mesh[partition], ready, std::mem::take(donated));
        }
        by_partition[partition] = device_results.into_iter().map(Some).collect();
    }
    let count = output_dims.len();
    let mut outputs = Vec::with_capacity(count);
    for (o, dims) in output_dims.into_iter().enumerate() {
        let buffers = by_partition
            .iter_mut()
            .map(|row| row.get_mut(o).and_then(Option::take).map(Arc::new))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::invalid("outputs of an SPMD program", "one per device", "fewer")
            })?;
        let sharding = shardings
            .get(o)
            .cloned()
            .ok_or_else(|| Error::invalid("output layouts of an SPMD program", count, o))?;
        outputs.push(Shards {
            devices: mesh.to_vec(),
            dims,
            sharding,
            buffers,
        });
    }
    Ok(Ran {
        outputs,
        replicated,
    })
}

/// The SPMD program of `graph`: a sharded parameter is read with its
/// shards' dims (then made flat, as the graph reads storages), an output
/// that keeps a layout is given its dims and sharding. Also returns each
/// output's dims.
fn partitioned(
    graph: &Graph,
    mesh: &[usize],
    kept: &[usize],
    sources: &[Source],
    layouts: &[Option<Arc<Shards>>],
) -> (Graph, Vec<Vec<i64>>) {
    let mut program = Graph {
        params: Vec::with_capacity(graph.params.len()),
        nodes: Vec::with_capacity(graph.nodes.len() + 8),
        outputs: Vec::new(),
        donors: graph.donors.clone(),
        spmd: None,
    };
    let push = |program: &mut Graph, node: Node, ty: TensorType| -> ValueId {
        program.nodes.push((node, ty));
        program.nodes.len() - 1
    };
    let mut param_shardings = Vec::with_capacity(graph.params.len());
    for (i, flat) in graph.params.iter().enumerate() {
        match &sources[kept[i]] {
            Source::Sharded(shards) => {
                program
                    .params
                    .push(TensorType::new(flat.dtype, &shards.dims));
                param_shardings.push(shards.sharding.clone());
            }
            _ => {
                program.params.push(flat.clone());
                param_shardings.push(Sharding::replicated(flat.rank(), mesh.len()));
            }
        }
    }
    let mut remap = Vec::with_capacity(graph.nodes.len());
    for (node, ty) in &graph.nodes {
        let id = match *node {
            Node::Param(i) => {
                let param_ty = program.params[i].clone();
                let read = push(&mut program, Node::Param(i), param_ty);
                match program.params[i].dims == ty.dims {
                    true => read,
                    false => push(&mut program, Node::Reshape(read), ty.clone()),
                }
            }
            _ => {
                let mut node = node.clone();
                node.for_each_operand_mut(|v| *v = remap[*v]);
                push(&mut program, node, ty.clone())
            }
        };
        remap.push(id);
    }
    let mut output_shardings = Vec::with_capacity(graph.outputs.len());
    let mut output_dims = Vec::with_capacity(graph.outputs.len());
    for (o, &value) in graph.outputs.iter().enumerate() {
        let value = remap[value];
        let ty = program.nodes[value].1.clone();
        let kept_layout = layouts.get(o).and_then(Option::as_ref).filter(|shards| {
            shards.dims.iter().product::<i64>() == ty.numel()
                && shards.sharding.check_dims(&shards.dims).is_ok()
        });
        match kept_layout {
            Some(shards) => {
                let out = match shards.dims == ty.dims {
                    true => value,
                    false => push(
                        &mut program,
                        Node::Reshape(value),
                        TensorType::new(ty.dtype, &shards.dims),
                    ),
                };
                program.outputs.push(out);
                output_shardings.push(Some(shards.sharding.clone()));
                output_dims.push(shards.dims.clone());
            }
            None => {
                // A value made flat only to be stored is output with the
                // dims it was computed in: XLA can keep it split on any dim
                // (a column-split gradient stays split) instead of
                // regathering it to cut the flat value.
                let value = match program.nodes[value].0 {
                    Node::Reshape(computed) => computed,
                    _ => value,
                };
                program.outputs.push(value);
                output_shardings.push(None);
                output_dims.push(program.nodes[value].1.dims.to_vec());
            }
        }
    }
    program.spmd = Some(Spmd {
        devices: mesh.to_vec(),
        params: param_shardings,
        outputs: output_shardings,
    });
    (program, output_dims)
}

/// Partition `partition`'s arguments on `device_index`: its shard of each
/// sharded source, a copy of every other.
fn arguments(
    client: &Client,
    device_index: usize,
    partition: usize,
    kept: &[usize],
    sources: &[Source],
) -> Result<Vec<Arc<Buffer>>> {
    let device = client.device(device_index)?;
    let device_id = device.id()?;
    kept.iter()
        .map(|&p| match &sources[p] {
            Source::Sharded(shards) => Ok(shards.buffers[partition].clone()),
            Source::Buffer(buffer) if buffer.device()?.id()? == device_id => Ok(buffer.clone()),
            Source::Buffer(buffer) => {
                metrics::add(Metric::SpmdReplicatedBytes, buffer.on_device_size()? as u64);
                Ok(Arc::new(buffer.copy_to_device(&device)?))
            }
            Source::Host { bytes, dtype, dims } => {
                host_input(client, device_index, &device, bytes, *dtype, dims)
            }
        })
        .collect()
}

/// Storages an SPMD program only read from one device's buffer take the
/// copies it made on the mesh as their value (replicated): a frozen weight
/// or a constant is copied to the mesh once, not at every step.
fn keep_on_mesh(
    run: &Run<'_>,
    read_only: &[(usize, Arc<Storage>)],
    replicated: Vec<(usize, Vec<Arc<Buffer>>)>,
) {
    let mesh = run.mesh;
    for (i, buffers) in replicated {
        let Source::Buffer(read) = &run.sources[run.kept[i]] else {
            continue;
        };
        let Some((_, storage)) = read_only.iter().find(|(p, _)| *p == run.kept[i]) else {
            continue;
        };
        let StorageValue::Buffer { buffer, dtype } = storage.recorded_value() else {
            continue;
        };
        let Ok(dims) = read.dims() else {
            continue;
        };
        if Arc::ptr_eq(&buffer, read) && buffers.len() == mesh.len() {
            let shards = Shards {
                devices: mesh.to_vec(),
                sharding: Sharding::replicated(dims.len(), mesh.len()),
                dims,
                buffers,
            };
            storage.set_recorded(StorageValue::Sharded {
                shards: Arc::new(shards),
                dtype,
            });
        }
    }
}

/// What a program computed for one output: a buffer on its device, or
/// one per device of a mesh.
pub(super) enum Computed {
    Buffer(Buffer),
    Sharded(Shards),
}

impl Computed {
    /// The storage value it makes, and the buffer device checks watch to
    /// tell whether the storage was written again since.
    pub(super) fn into_value(self) -> Result<(StorageValue, Arc<Buffer>)> {
        match self {
            Computed::Buffer(buffer) => {
                let dtype = buffer.dtype()?;
                let buffer = Arc::new(buffer);
                Ok((
                    StorageValue::Buffer {
                        buffer: buffer.clone(),
                        dtype,
                    },
                    buffer,
                ))
            }
            Computed::Sharded(shards) => {
                let first = shards.buffers[0].clone();
                let dtype = first.dtype()?;
                let shards = Arc::new(shards);
                Ok((StorageValue::Sharded { shards, dtype }, first))
            }
        }
    }

    /// A device-side check's flag (a scalar: any holder's copy).
    pub(super) fn into_flag(self) -> Result<Buffer> {
        match self {
            Computed::Buffer(buffer) => Ok(buffer),
            Computed::Sharded(mut shards) => {
                let holder = shards.sharding.tile_holders().next().unwrap_or(0);
                Arc::try_unwrap(shards.buffers.swap_remove(holder)).map_err(|_| {
                    Error::invalid(
                        "a check flag of an SPMD program",
                        "its own buffer",
                        "a shared one",
                    )
                })
            }
        }
    }
}
