//! Eager execution: one op's graph runs as its own program now, and its
//! results are installed; in deferred mode it is recorded instead.

use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::{FxHashMap, FxHashSet};

use super::{cache, deferred, launch, plan};
use crate::builder::{Builder, Mode, Output, ParamSource, PendingOutput};
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{Graph, Node, TensorType};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client};
use crate::storage::{self, ElementRead, View};

/// The elements `read` names on the host: a program slices them out on the
/// device, so only they are copied.
pub(super) fn read_elements(read: ElementRead<'_>) -> Result<Vec<u8>> {
    let ElementRead {
        client,
        device_index,
        buffer,
        dtype,
        elements,
    } = read;
    let dims = buffer.dims()?;
    let count: i64 = dims.iter().product();
    let flat = TensorType::new(dtype, &[count]);
    let mut nodes = vec![(Node::Param(0), TensorType::new(dtype, &dims))];
    if dims.len() != 1 {
        nodes.push((Node::Reshape(0), flat));
    }
    nodes.push((
        Node::Slice {
            operand: nodes.len() - 1,
            start: vec![elements.start as i64],
            limit: vec![elements.end as i64],
            strides: vec![1],
        },
        TensorType::new(dtype, &[elements.len() as i64]),
    ));
    let graph = Graph {
        params: vec![nodes[0].1.clone()],
        outputs: vec![nodes.len() - 1],
        nodes,
        donors: Vec::new(),
        spmd: None,
    };
    let sources = [launch::Source::Buffer(buffer.clone())];
    let (_, slices) = launch::execute(client, device_index, &graph, &[0], &sources, None, false)?;
    match slices.first() {
        Some(slice) => slice.to_host(),
        None => Err(Error::invalid("outputs of a slicing read", 1, 0)),
    }
}

/// TPUs have no 64-bit floats: a float64 (or complex128) op there is a
/// clear error, never a silently narrowed result.
fn check_platform_dtypes(b: &Builder) -> Result<()> {
    if !b.client.platform_name()?.eq_ignore_ascii_case("tpu") {
        return Ok(());
    }
    let wide = |t: &TensorType| matches!(t.dtype, DType::F64 | DType::C128);
    let uses_wide = b.graph.params.iter().any(wide) || b.graph.nodes.iter().any(|(_, t)| wide(t));
    if uses_wide {
        return Err(Error::invalid(
            format!("{}: dtype", b.op),
            "a dtype the TPU supports (float32, bfloat16, float16, integers, bool)",
            "float64, which TPUs do not have; convert with .float() first",
        ));
    }
    Ok(())
}

/// Every value of the op's graph fits on its device. A plugin asked for more
/// aborts the process (a C++ exception Rust cannot catch), so the op is
/// refused before it is lowered: `torch.zeros(1).expand(2**31, 2**31).sum()`
/// is an out-of-memory error, not a crash.
fn check_sizes(b: &Builder, device_index: usize) -> Result<()> {
    let bytes = |ty: &TensorType| {
        ty.dims
            .iter()
            .try_fold(ty.dtype.size_in_bytes() as u64, |n, &d| {
                n.checked_mul(u64::try_from(d).ok()?)
            })
    };
    let types = b
        .graph
        .params
        .iter()
        .chain(b.graph.nodes.iter().map(|(_, ty)| ty));
    // The largest value, or None when one is past 2^64 bytes.
    let largest = types
        .map(bytes)
        .try_fold(0u64, |most, value| Some(most.max(value?)));
    storage::check_fits(
        b.client,
        device_index,
        || format!("{}: a value of its program", b.op),
        largest,
    )
}

/// Runs the op `b` built (recorded instead outside eager mode); keeps its
/// plan for `site`'s later calls where it can.
pub(super) fn run(mut b: Builder, site: &plan::Site) -> Result<Vec<Output>> {
    let device_index = b.device_index.unwrap_or(0);
    let mut graph_outputs = Vec::new();
    for out in &b.outputs {
        if let PendingOutput::New { value, .. } = out {
            graph_outputs.push(*value);
        }
    }
    let written: Vec<usize> = (0..b.slots.len()).filter(|&i| b.slots[i].written).collect();
    for &i in &written {
        graph_outputs.push(b.slots[i].flat);
    }
    if graph_outputs.is_empty() {
        return Ok(b
            .outputs
            .iter()
            .map(|o| match o {
                PendingOutput::Alias(i) => Output::Alias(*i),
                PendingOutput::None => Output::None,
                PendingOutput::New { .. } => unreachable!("a new output is a graph output"),
            })
            .collect());
    }
    check_platform_dtypes(&b)?;
    check_sizes(&b, device_index)?;
    if b.mode != Mode::Eager {
        return deferred::record(b, device_index);
    }
    if b.sources
        .iter()
        .any(|s| matches!(s, ParamSource::Recorded { .. }))
    {
        // A sharded input: the op runs as its own SPMD program. Its other
        // storages are recorded as storages too, so those it only reads
        // can stay on the mesh afterwards.
        for slot in &b.slots {
            if let (Node::Param(i), ty) = &b.graph.nodes[slot.flat] {
                if matches!(b.sources[*i], ParamSource::Storage(_)) {
                    b.sources[*i] = ParamSource::Recorded {
                        storage: slot.storage.clone(),
                        view: View::contiguous(&ty.dims, ty.dtype),
                    };
                }
            }
        }
        let client = b.client.clone();
        let outputs = deferred::record(b, device_index)?;
        deferred::flush_device(&client, device_index)?;
        return Ok(outputs);
    }
    b.graph.outputs = graph_outputs;
    let exe = cache::executable(b.client, device_index, &b.graph, None)?;
    let device = b.client.device(device_index)?;
    let mut args = Vec::with_capacity(b.sources.len());
    for source in &b.sources {
        args.push(match source {
            ParamSource::Storage(buffer) => buffer.clone(),
            ParamSource::Host { bytes, dtype, dims } => {
                host_input(b.client, device_index, &device, bytes, *dtype, dims)?
            }
            ParamSource::Recorded { .. } => {
                return Err(Error::invalid(
                    format!("{}: an input", b.op),
                    "a device buffer in eager mode",
                    "a value recorded for deferred mode",
                ))
            }
        });
    }
    let template = plan::output_template(&b);
    plan::remember(site, &b, &exe, &template, &written);
    let results = launch::launch(b.client, device_index, &exe, &args, &[])?;
    let written = written.iter().map(|&i| {
        let slot = &b.slots[i];
        (&slot.storage, b.graph.ty(slot.flat).dtype)
    });
    plan::install_results(b.client, device_index, &template, written, results)
}

/// Only scalars and tiny tensors repeat often enough to be worth keeping.
const MAX_CACHED_HOST_BYTES: usize = 64;

/// A cached host input's bytes, inline: the key is made on every call.
#[derive(Clone, PartialEq, Eq, Hash)]
struct HostBytes {
    len: u8,
    bytes: [u8; MAX_CACHED_HOST_BYTES],
}

impl HostBytes {
    /// None for more bytes than are cached.
    fn new(bytes: &[u8]) -> Option<HostBytes> {
        let mut inline = HostBytes {
            len: u8::try_from(bytes.len()).ok()?,
            bytes: [0; MAX_CACHED_HOST_BYTES],
        };
        inline.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(inline)
    }
}

type HostInputKey = (usize, usize, DType, Dims, HostBytes);

/// Small host inputs seen, and the buffers of those seen twice with when
/// each was last used (a count of uses), so the least recently used goes
/// first: the count of buffers kept stops growing once the cache is full.
#[derive(Default)]
struct HostInputs {
    seen: FxHashSet<HostInputKey>,
    buffers: FxHashMap<HostInputKey, (Arc<Buffer>, u64)>,
    uses: u64,
}

/// A device buffer holding small host input `bytes`. Scalars that repeat (a
/// fixed learning rate, alpha = -1, eps) are cached by value from their
/// second use: an upload costs more than the op itself on small tensors.
/// Values that change every call (a scheduled learning rate, Adam's bias
/// corrections) are not cached, and a value that repeats only for a while
/// is evicted by newer ones, so neither leaves buffers behind. Buffers
/// passed as inputs are never donated, so sharing them is safe.
pub(crate) fn host_input(
    client: &Client,
    device_index: usize,
    device: &crate::runtime::Device,
    bytes: &[u8],
    dtype: DType,
    dims: &[i64],
) -> Result<Arc<Buffer>> {
    // Values remembered (emptied when full: what repeats comes back) and
    // buffers kept (least recently used evicted).
    const MAX_SEEN: usize = 4096;
    const MAX_BUFFERS: usize = 64;
    let upload = || -> Result<Arc<Buffer>> {
        metrics::add(Metric::HostToDeviceBytes, bytes.len() as u64);
        Ok(Arc::new(
            client.buffer_from_host(bytes, dtype, dims, device)?,
        ))
    };
    let Some(host_bytes) = HostBytes::new(bytes) else {
        return upload();
    };
    static CACHE: OnceLock<Mutex<HostInputs>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (
        client.id(),
        device_index,
        dtype,
        Dims::from(dims),
        host_bytes,
    );
    {
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.uses += 1;
        let now = cache.uses;
        if let Some((buffer, last_use)) = cache.buffers.get_mut(&key) {
            *last_use = now;
            return Ok(buffer.clone());
        }
        if !cache.seen.contains(&key) {
            if cache.seen.len() >= MAX_SEEN {
                cache.seen.clear();
            }
            cache.seen.insert(key);
            drop(cache);
            return upload();
        }
    }
    let buffer = upload()?;
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if cache.buffers.len() >= MAX_BUFFERS {
        let oldest = cache
            .buffers
            .iter()
            .min_by_key(|(_, (_, last_use))| *last_use)
            .map(|(key, _)| key.clone());
        if let Some(oldest) = oldest {
            cache.buffers.remove(&oldest);
        }
    }
    let now = cache.uses;
    cache.buffers.insert(key, (buffer.clone(), now));
    Ok(buffer)
}
