//! The executable caches and recompile explanations.
//!
//! In memory, executables are keyed by the graph's structure (a hash, then
//! equality), so a hit costs no lowering. On disk (`disk_cache`) they are
//! kept across processes, so a second run of a script compiles nothing.
//!
//! A deferred graph compiled at a site (the `rtpu.step()` line) that
//! compiled before is a recompile: it is counted, explained against the
//! nearest graph that site compiled (with `RTPU_DEBUG=recompile` or
//! `set_explain_recompiles`), and refused past `set_recompile_limit`.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use rustc_hash::{FxHashMap, FxHasher};

use super::deferred::RecordedOp;
use super::disk_cache::{env_count, DiskEntry};
use super::location::location_text;
use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{Graph, TensorType};
use crate::lower::lower;
use crate::metrics::{self, Metric};
use crate::runtime::{Client, CompileOptions, LoadedExecutable};
use crate::storage::View;

/// Where a deferred graph came from: what explanations name.
pub(crate) struct Provenance<'a> {
    /// The location of the flush (the step's line).
    pub site: u32,
    pub ops: &'a [RecordedOp],
    /// For each parameter, the index in `ops` of the op that first read it
    /// and how it read it.
    pub params: Vec<(usize, ReadAs)>,
}

/// How a recorded op read a graph parameter: "float32[8, 32]", with
/// " sharded" or "a host " where that applies. Kept as data and formatted
/// only for an explanation: every recorded op that reads a new input makes
/// one.
#[derive(Clone, Debug)]
pub(crate) struct ReadAs {
    pub dtype: DType,
    pub sizes: Dims,
    pub from: ReadFrom,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum ReadFrom {
    Storage,
    Sharded,
    Host,
}

impl ReadAs {
    pub fn of(view: &View, from: ReadFrom) -> ReadAs {
        ReadAs {
            dtype: view.dtype,
            sizes: view.sizes.clone(),
            from,
        }
    }

    pub fn of_type(ty: &TensorType, from: ReadFrom) -> ReadAs {
        ReadAs {
            dtype: ty.dtype,
            sizes: ty.dims.clone(),
            from,
        }
    }
}

impl fmt::Display for ReadAs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.from {
            ReadFrom::Storage => write!(f, "{}{:?}", self.dtype, self.sizes),
            ReadFrom::Sharded => write!(f, "{}{:?} sharded", self.dtype, self.sizes),
            ReadFrom::Host => write!(f, "a host {}{:?}", self.dtype, self.sizes),
        }
    }
}

type MemoryKey = (usize, usize, u64);

/// One executable kept in memory.
struct MemoryEntry {
    graph: Graph,
    exe: Arc<LoadedExecutable>,
    /// The cache's clock when this entry was last found or stored.
    last_use: u64,
}

/// The in-memory executables, at most `max_memory_entries()` of them: the
/// one used least recently goes first (its program stays on disk).
#[derive(Default)]
struct MemoryCache {
    /// Graphs with the same key (a hash collision is an equality miss).
    entries: FxHashMap<MemoryKey, Vec<MemoryEntry>>,
    len: usize,
    clock: u64,
}

impl MemoryCache {
    fn find(&mut self, key: &MemoryKey, graph: &Graph) -> Option<Arc<LoadedExecutable>> {
        self.clock += 1;
        let entry = self
            .entries
            .get_mut(key)?
            .iter_mut()
            .find(|e| e.graph == *graph)?;
        entry.last_use = self.clock;
        Some(entry.exe.clone())
    }

    fn store(&mut self, key: MemoryKey, graph: &Graph, exe: Arc<LoadedExecutable>, max: usize) {
        while self.len >= max.max(1) {
            self.evict_least_recent();
        }
        self.clock += 1;
        self.entries.entry(key).or_default().push(MemoryEntry {
            graph: graph.clone(),
            exe,
            last_use: self.clock,
        });
        self.len += 1;
    }

    fn evict_least_recent(&mut self) {
        let oldest = self
            .entries
            .iter()
            .flat_map(|(key, list)| {
                list.iter()
                    .enumerate()
                    .map(move |(i, e)| (e.last_use, *key, i))
            })
            .min();
        let Some((_, key, index)) = oldest else {
            return;
        };
        let list = self.entries.get_mut(&key).expect("the key just found");
        list.swap_remove(index);
        if list.is_empty() {
            self.entries.remove(&key);
        }
        self.len -= 1;
        metrics::add(Metric::ExecutablesEvicted, 1);
    }
}

/// The in-memory cap: `RTPU_MEMORY_CACHE_ENTRIES`, else 1024 executables.
fn max_memory_entries() -> usize {
    static WARNED: AtomicBool = AtomicBool::new(false);
    env_count("RTPU_MEMORY_CACHE_ENTRIES", 1024, &WARNED) as usize
}

fn memory() -> MutexGuard<'static, MemoryCache> {
    static MEMORY: OnceLock<Mutex<MemoryCache>> = OnceLock::new();
    super::global(&MEMORY)
}

/// The key of a graph in memory, computed on every op call: rustc's
/// FxHasher, several times cheaper than SipHash on a graph's many small
/// integers. Not resistant to chosen collisions, and need not be: a
/// collision is an equality miss, not a wrong program.
fn structural_hash(graph: &Graph) -> u64 {
    let mut hasher = FxHasher::default();
    graph.hash(&mut hasher);
    hasher.finish()
}

/// The executable for `graph` on `device_index`: from memory, from disk, or
/// compiled (and then stored in both).
pub(crate) fn executable(
    client: &Client,
    device_index: usize,
    graph: &Graph,
    provenance: Option<&Provenance<'_>>,
) -> Result<Arc<LoadedExecutable>> {
    let key = (client.id(), device_index, structural_hash(graph));
    if let Some(exe) = memory().find(&key, graph) {
        metrics::add(Metric::CacheHits, 1);
        return Ok(exe);
    }
    let text = lower(graph);
    dump(&text);
    let options = compile_options(client, device_index, graph)?;
    let disk = DiskEntry::new(client, &options, &text);
    let exe = match disk.as_ref().and_then(|d| d.load(client, &text)) {
        Some(exe) => {
            metrics::add(Metric::DiskCacheHits, 1);
            if let Some(p) = provenance {
                remember(p, graph);
            }
            Arc::new(exe)
        }
        None => {
            if let Some(p) = provenance {
                check_recompile(p, graph)?;
            }
            // Compiling outside the memory lock lets other ops run meanwhile;
            // a racing compile of the same graph just wastes one compile.
            let start = Instant::now();
            let exe = client.compile(&text, &options)?;
            metrics::add_elapsed(Metric::CompileNs, start);
            metrics::add(Metric::ExecutablesCompiled, 1);
            if let Some(d) = &disk {
                d.store(&text, &exe);
            }
            Arc::new(exe)
        }
    };
    if graph.spmd.is_some() {
        let count = exe.collectives().map_or(0, |c| c.count);
        metrics::add(Metric::SpmdCollectives, count as u64);
    }
    memory().store(key, graph, exe.clone(), max_memory_entries());
    Ok(exe)
}

/// One device's program, or an SPMD program with one partition per device
/// of its mesh (XLA choosing the layouts of outputs not given one).
fn compile_options(client: &Client, device_index: usize, graph: &Graph) -> Result<CompileOptions> {
    let Some(spmd) = &graph.spmd else {
        let device_id = client.device(device_index)?.id()? as i64;
        return Ok(CompileOptions {
            device_assignment: Some(vec![vec![device_id]]),
            ..Default::default()
        });
    };
    let ids = spmd
        .devices
        .iter()
        .map(|&d| Ok(client.device(d)?.id()? as i64))
        .collect::<Result<Vec<i64>>>()?;
    Ok(CompileOptions {
        num_partitions: ids.len(),
        use_spmd_partitioning: true,
        device_assignment: Some(vec![ids]),
        propagate_output_shardings: spmd.outputs.iter().map(Option::is_none).collect(),
        ..Default::default()
    })
}

/// Writes each program compiled or loaded (on a memory miss) to
/// `$RTPU_DUMP_DIR/<n>.mlir`, numbered in order, when the variable is set.
fn dump(text: &str) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let Some(dir) = std::env::var_os("RTPU_DUMP_DIR").filter(|d| !d.is_empty()) else {
        return;
    };
    let path = PathBuf::from(dir).join(format!("{:05}.mlir", NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = std::fs::create_dir_all(path.parent().unwrap_or(&path))
        .and_then(|()| std::fs::write(&path, text));
    if let Err(e) = written {
        eprintln!("rtpu: cannot write {}: {e}", path.display());
    }
}

// ----- recompile explanations ------------------------------------------

/// What a site compiled: enough to say what changed next time.
struct Summary {
    /// Per parameter: its type, the op that first read it, how it read it.
    inputs: Vec<(TensorType, usize, ReadAs)>,
    ops: Vec<RecordedOp>,
}

impl Summary {
    fn of(p: &Provenance<'_>, graph: &Graph) -> Summary {
        Summary {
            inputs: graph
                .params
                .iter()
                .zip(&p.params)
                .map(|(ty, (op, read_as))| (ty.clone(), *op, read_as.clone()))
                .collect(),
            ops: p.ops.to_vec(),
        }
    }

    /// How different two graphs look: differing inputs plus differing ops.
    fn distance(&self, other: &Summary) -> usize {
        let inputs = self
            .inputs
            .iter()
            .zip(&other.inputs)
            .filter(|(a, b)| a.0 != b.0)
            .count()
            + self.inputs.len().abs_diff(other.inputs.len());
        let ops = self
            .ops
            .iter()
            .zip(&other.ops)
            .filter(|(a, b)| a.name != b.name)
            .count()
            + self.ops.len().abs_diff(other.ops.len());
        inputs + ops
    }
}

static EXPLAIN: AtomicBool = AtomicBool::new(false);
/// 0 means no limit.
static RECOMPILE_LIMIT: AtomicU64 = AtomicU64::new(0);

/// Prints an explanation of every recompile to stderr (also turned on by
/// `RTPU_DEBUG=recompile`).
pub fn set_explain_recompiles(on: bool) {
    EXPLAIN.store(on, Ordering::Relaxed);
}

fn explaining() -> bool {
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    EXPLAIN.load(Ordering::Relaxed)
        || *FROM_ENV.get_or_init(|| {
            std::env::var("RTPU_DEBUG")
                .map(|v| v.split(',').any(|item| item.trim() == "recompile"))
                .unwrap_or(false)
        })
}

/// Past `limit` recompiles at one site, the next one is an error carrying
/// its explanation; `None` removes the limit.
pub fn set_recompile_limit(limit: Option<u64>) {
    RECOMPILE_LIMIT.store(limit.map_or(0, |l| l.saturating_add(1)), Ordering::Relaxed);
}

fn sites() -> MutexGuard<'static, HashMap<u32, Vec<Summary>>> {
    static SITES: OnceLock<Mutex<HashMap<u32, Vec<Summary>>>> = OnceLock::new();
    super::global(&SITES)
}

fn remember(p: &Provenance<'_>, graph: &Graph) {
    sites()
        .entry(p.site)
        .or_default()
        .push(Summary::of(p, graph));
}

/// Counts, explains and limits a compile at a site that compiled before.
fn check_recompile(p: &Provenance<'_>, graph: &Graph) -> Result<()> {
    let summary = Summary::of(p, graph);
    let mut sites = sites();
    let history = sites.entry(p.site).or_default();
    let Some(nearest) = history.iter().min_by_key(|old| old.distance(&summary)) else {
        history.push(summary);
        return Ok(());
    };
    let explanation = explain(nearest, &summary);
    let count = history.len() as u64 + 1;
    if let Some(limit) = RECOMPILE_LIMIT.load(Ordering::Relaxed).checked_sub(1) {
        if count - 1 > limit {
            return Err(Error::RecompileLimit {
                site: location_text(p.site),
                count,
                limit,
                explanation,
            });
        }
    }
    history.push(summary);
    metrics::add(Metric::Recompiles, 1);
    if explaining() {
        eprintln!(
            "rtpu: recompiling the graph flushed at {} (its graph number {count} there): \
             {explanation}",
            location_text(p.site)
        );
    }
    Ok(())
}

fn describe_op(op: &RecordedOp) -> String {
    format!("{} at {}", op.name, location_text(op.location))
}

/// What differs between the graph a site compiled before and the new one.
fn explain(old: &Summary, new: &Summary) -> String {
    const MAX_ITEMS: usize = 4;
    let mut items = Vec::new();
    for (i, (now, before)) in new.inputs.iter().zip(&old.inputs).enumerate() {
        if now.0 != before.0 {
            let reader = new
                .ops
                .get(now.1)
                .map(|op| format!(" (read by {})", describe_op(op)))
                .unwrap_or_default();
            items.push(format!(
                "input {i}{reader} changed from {} to {}",
                before.2, now.2
            ));
        }
    }
    if new.inputs.len() != old.inputs.len() {
        items.push(format!(
            "{} inputs instead of {}",
            new.inputs.len(),
            old.inputs.len()
        ));
    }
    let first_op_change = new
        .ops
        .iter()
        .zip(&old.ops)
        .position(|(a, b)| a.name != b.name);
    match first_op_change {
        Some(i) => items.push(format!(
            "op {i} is {} where it was {}",
            describe_op(&new.ops[i]),
            describe_op(&old.ops[i])
        )),
        None if new.ops.len() > old.ops.len() => items.push(format!(
            "{} ops instead of {}; the first new one is {}",
            new.ops.len(),
            old.ops.len(),
            describe_op(&new.ops[old.ops.len()])
        )),
        None if new.ops.len() < old.ops.len() => items.push(format!(
            "{} ops instead of {}; the first missing one is {}",
            new.ops.len(),
            old.ops.len(),
            describe_op(&old.ops[new.ops.len()])
        )),
        None => {}
    }
    if items.is_empty() {
        return "the same inputs and ops with different attributes (a Python number that \
                sets a shape, dim or slice, or a changed op argument)"
            .to_string();
    }
    let more = items.len().saturating_sub(MAX_ITEMS);
    items.truncate(MAX_ITEMS);
    let mut text = items.join("; ");
    if more > 0 {
        text.push_str(&format!("; and {more} more differences"));
    }
    text
}
