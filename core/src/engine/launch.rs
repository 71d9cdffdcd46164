//! Running a built graph on one device: each parameter's buffer from its
//! source (a storage's buffer, or host data uploaded), the launch, and
//! the donated inputs handed to the launch's bookkeeping.

use std::sync::Arc;
use std::time::Instant;

use super::{cache, host_input, work};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client, Execution, LoadedExecutable};
use crate::storage::Shards;

/// What feeds a parameter of a graph when it runs.
#[derive(Clone)]
pub(crate) enum Source {
    Buffer(Arc<Buffer>),
    /// A sharded storage's buffers: the graph runs as an SPMD program.
    Sharded(Arc<Shards>),
    Host {
        bytes: Vec<u8>,
        dtype: DType,
        dims: Vec<i64>,
    },
}

/// Runs `graph` on `device_index`, parameter `i` read from
/// `sources[kept[i]]`, donating those of `graph.donors` that `donate` says;
/// returns the executable and its outputs.
pub(super) fn execute(
    client: &Client,
    device_index: usize,
    graph: &Graph,
    kept: &[usize],
    sources: &[Source],
    provenance: Option<&cache::Provenance<'_>>,
    donate: bool,
) -> Result<(Arc<LoadedExecutable>, Vec<Buffer>)> {
    let exe = cache::executable(client, device_index, graph, provenance)?;
    let device = client.device(device_index)?;
    let mut args = Vec::with_capacity(kept.len());
    for &p in kept {
        args.push(match &sources[p] {
            Source::Buffer(buffer) => buffer.clone(),
            Source::Host { bytes, dtype, dims } => {
                host_input(client, device_index, &device, bytes, *dtype, dims)?
            }
            Source::Sharded(_) => {
                return Err(Error::invalid(
                    "an input of a one-device program",
                    "a tensor on that device",
                    "a sharded tensor",
                ))
            }
        });
    }
    let donors: Vec<usize> = match donate {
        true => graph.donated_params().collect(),
        false => Vec::new(),
    };
    let buffers = launch(client, device_index, &exe, &args, &donors)?;
    metrics::add(Metric::GraphExecutions, 1);
    metrics::add(Metric::BuffersDonated, donors.len() as u64);
    if buffers.len() != graph.outputs.len() {
        return Err(Error::invalid(
            "outputs of a deferred graph",
            graph.outputs.len(),
            buffers.len(),
        ));
    }
    Ok((exe, buffers))
}

/// Enqueues `exe` on `device_index` with `args`, donating those at the
/// indices `donate`, without waiting: later reads wait for the values and
/// the host goes on meanwhile. `work` keeps the donated buffers until the
/// program has run (dropping them sooner would wait for it).
pub(super) fn launch(
    client: &Client,
    device_index: usize,
    exe: &LoadedExecutable,
    args: &[Arc<Buffer>],
    donate: &[usize],
) -> Result<Vec<Buffer>> {
    let start = Instant::now();
    let results = exe.execute_with_events(&[args], donate);
    metrics::add_elapsed(Metric::ExecuteNs, start);
    let Execution { outputs, finished } = results?;
    let buffers = outputs.into_iter().next().unwrap_or_default();
    if let Some(Some(finished)) = finished.into_iter().next() {
        let donated = donate.iter().map(|&d| args[d].clone()).collect();
        work::launched(client, device_index, finished, donated);
    }
    Ok(buffers)
}
