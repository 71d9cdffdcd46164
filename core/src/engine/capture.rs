//! Captured graphs, for `torch.compile(backend="tpu")`: the ops run between
//! `begin(inputs)` and `end(outputs)` are recorded like a deferred step, run
//! once as one program, and kept as a `CapturedGraph` that later calls
//! replay on new inputs with no per-op work: each input's buffer is bound
//! straight to the executable, outputs become new storages, and inputs the
//! graph writes (optimizer state, BatchNorm statistics) take their new
//! values in place.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::checks::{self, OnFailure};
use super::deferred::{self, CapturedOutput, RecordedOp, SplicedParam};
use super::launch::Source;
use super::location;
use super::mode::{self, Mode};
use super::{host_input, launch, Output, TensorArg};
use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};
use crate::ir::Graph;
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client, LoadedExecutable};
use crate::storage::{Storage, StorageValue, View};

/// What feeds a parameter of a captured program.
enum Binding {
    /// The buffer of input `i`.
    Input(usize),
    /// A tensor the graph read that is not an input (a constant of the
    /// graph): its value at capture.
    Fixed(Arc<Buffer>),
    /// A scalar or host data the graph's ops baked in.
    Host {
        bytes: Vec<u8>,
        dtype: DType,
        dims: Vec<i64>,
    },
    /// The upstream flag (see `checks`): that of the graphs still to be
    /// checked, or this false one when none are.
    Upstream(Arc<Buffer>),
}

/// Where a value the program computes goes.
enum Written {
    /// The new value of input `i`'s storage.
    Input(usize),
    /// A new storage, returned as these outputs (index, view).
    Outputs(Vec<(usize, View)>),
    /// A value nothing returns.
    Dropped,
}

/// An output that is (a view of) an input: it aliases that input's storage.
struct InputView {
    output: usize,
    input: usize,
    view: View,
}

/// A graph recorded once and replayed on new inputs.
pub struct CapturedGraph {
    client: Client,
    device_index: usize,
    /// The program's graph, for replays inside a step (recorded into it).
    graph: crate::ir::Graph,
    /// None for an SPMD program (a graph of sharded inputs): replays record
    /// the graph into the pending one, which runs it over the mesh.
    exe: Option<Arc<LoadedExecutable>>,
    params: Vec<Binding>,
    /// Parameters that read an input the program overwrites: a replay
    /// donates the input's buffer when nothing else holds it.
    donors: Vec<usize>,
    written: Vec<Written>,
    input_views: Vec<InputView>,
    num_inputs: usize,
    num_outputs: usize,
    /// Whether the program takes an upstream flag and ends with its
    /// chained one (see `checks`).
    chained: bool,
    checks: Vec<((ErrorCode, String), usize)>,
    /// Per entry of `written`: whether the program writes the old value
    /// back when a check fails.
    kept_on_failure: Vec<bool>,
    ops: Vec<RecordedOp>,
    site: u32,
}

struct Capture {
    inputs: Vec<TensorArg>,
    /// Why the recorded ops cannot be replayed, once something ran part of
    /// them before the end (a host read or a CPU fallback flushed).
    broken: Option<String>,
    /// Each input's value when the capture began.
    values: Vec<StorageValue>,
    device_index: usize,
    /// The mode to return to when the capture ends.
    before: Mode,
}

fn capture() -> MutexGuard<'static, Option<Capture>> {
    static CAPTURE: OnceLock<Mutex<Option<Capture>>> = OnceLock::new();
    super::global(&CAPTURE)
}

/// Starts recording a graph of `inputs` (on one device). What was pending
/// runs first, so the graph holds only the captured ops.
pub fn begin(inputs: &[TensorArg]) -> Result<()> {
    super::install_pending_work();
    if capture().is_some() {
        return Err(Error::invalid(
            "graph capture",
            "one capture at a time",
            "a capture that has not ended",
        ));
    }
    // Not under the capture lock: a flush takes it (`note_flush`).
    deferred::flush_all(None)?;
    let device_index = inputs.first().map_or(0, |t| t.storage.device_index());
    let mut values = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        if input.storage.device_index() != device_index {
            return Err(Error::invalid(
                format!("captured graph input {i}"),
                format!("a tensor on tpu:{device_index}, like input 0"),
                format!("one on tpu:{}", input.storage.device_index()),
            ));
        }
        values.push(input.storage.value()?);
    }
    *capture() = Some(Capture {
        inputs: inputs.to_vec(),
        broken: None,
        values,
        device_index,
        before: mode::current(),
    });
    mode::enter(Mode::Capture);
    Ok(())
}

/// Ends the capture without a graph: what it recorded stays pending and
/// runs at the next flush. Nothing happens without a capture.
pub fn abandon() {
    if let Some(state) = capture().take() {
        mode::enter(state.before);
    }
}

/// Ends the capture: runs what was recorded as one program (so `outputs`
/// hold this call's results) and returns the graph to replay, or why it
/// cannot be replayed (then later calls should run their ops again).
pub fn end(
    client: &Client,
    outputs: &[TensorArg],
    site: &str,
) -> Result<std::result::Result<CapturedGraph, String>> {
    let state = capture()
        .take()
        .ok_or_else(|| Error::invalid("graph capture", "a capture to end", "none began"))?;
    let site = location::intern_location(site);
    let ran = deferred::run_for_capture(client, state.device_index, site);
    mode::enter(state.before);
    let Some(ran) = ran? else {
        return Ok(Err("the graph computes nothing on the device".to_string()));
    };
    if let Some(reason) = state.broken {
        return Ok(Err(reason));
    }
    Ok(bind(client, &state, outputs, ran, site))
}

/// Called whenever a pending graph runs: during a capture that splits the
/// recorded ops, so they cannot be replayed as one graph.
pub(super) fn note_flush(site: u32) {
    if mode::current() == Mode::Capture {
        broken(format!(
            "part of it ran before its end (a host read or a CPU fallback at {})",
            location::location_text(site)
        ));
    }
}

/// Called when a storage's values are read on the host: during a capture
/// the recorded graph may depend on them (shapes, gathered positions), so
/// replaying it on other inputs could be wrong.
pub(crate) fn note_host_read() {
    if mode::current() == Mode::Capture {
        broken("an op read tensor values on the host".to_string());
    }
}

fn broken(reason: String) {
    if let Some(state) = capture().as_mut() {
        state.broken.get_or_insert(reason);
    }
}

/// A graph that ran for a capture (`capture::end`): what replaying it needs.
pub(super) struct RanGraph {
    /// The program's graph: parameters, then written values and check
    /// flags as outputs.
    pub graph: Graph,
    /// None for an SPMD program (see `CapturedGraph::exe`).
    pub exe: Option<Arc<LoadedExecutable>>,
    /// The parameter that takes the upstream flag, if the program chains
    /// (see `checks`).
    pub upstream: Option<usize>,
    /// What feeds each parameter of the program.
    pub sources: Vec<Source>,
    /// The storages whose new values are the program's first outputs.
    pub written: Vec<Arc<Storage>>,
    /// The device-side checks, whose flags are the next outputs; a program
    /// that chains ends with its chained flag.
    pub checks: Vec<((ErrorCode, String), usize)>,
    /// Per written storage: whether the program writes its old value back
    /// when a check fails (`keep_old_values_on_failure`).
    pub kept_on_failure: Vec<bool>,
    pub ops: Vec<RecordedOp>,
}

fn bind(
    client: &Client,
    state: &Capture,
    outputs: &[TensorArg],
    ran: RanGraph,
    site: u32,
) -> std::result::Result<CapturedGraph, String> {
    let is_input = |storage: &Arc<Storage>| {
        state
            .inputs
            .iter()
            .position(|t| Arc::ptr_eq(&t.storage, storage))
    };
    let params = ran
        .sources
        .into_iter()
        .enumerate()
        .map(|(p, source)| match source {
            Source::Buffer(buffer) if ran.upstream == Some(p) => Ok(Binding::Upstream(buffer)),
            Source::Buffer(buffer) => Ok(state
                .values
                .iter()
                .position(|v| matches!(v, StorageValue::Buffer { buffer: b, .. } if Arc::ptr_eq(b, &buffer)))
                .map_or(Binding::Fixed(buffer), Binding::Input)),
            Source::Host { bytes, dtype, dims } => Ok(Binding::Host { bytes, dtype, dims }),
            Source::Sharded(shards) => state
                .values
                .iter()
                .position(|v| matches!(v, StorageValue::Sharded { shards: s, .. } if Arc::ptr_eq(s, &shards)))
                .map(Binding::Input)
                .ok_or_else(|| "it read a sharded tensor that is not one of its inputs".to_string()),
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let mut returned = vec![false; outputs.len()];
    let written: Vec<Written> = ran
        .written
        .iter()
        .map(|storage| {
            if let Some(i) = is_input(storage) {
                return Written::Input(i);
            }
            let views: Vec<(usize, View)> = outputs
                .iter()
                .enumerate()
                .filter(|(_, t)| Arc::ptr_eq(&t.storage, storage))
                .map(|(k, t)| (k, t.view.clone()))
                .collect();
            for (k, _) in &views {
                returned[*k] = true;
            }
            if views.is_empty() {
                Written::Dropped
            } else {
                Written::Outputs(views)
            }
        })
        .collect();
    let overwritten = |i: usize| {
        written
            .iter()
            .any(|w| matches!(w, Written::Input(j) if *j == i))
    };
    let donors = ran
        .graph
        .donated_params()
        .filter(|&p| matches!(params[p], Binding::Input(i) if overwritten(i)))
        .collect();
    // Outputs the graph does not compute may be inputs or views of them
    // (tensors saved for backward); they alias the replay's inputs.
    let mut input_views = Vec::new();
    for (k, t) in outputs.iter().enumerate() {
        if returned[k] {
            continue;
        }
        let Some(input) = is_input(&t.storage) else {
            return Err(format!(
                "output {k} is neither computed by the graph nor an input (a constant)"
            ));
        };
        input_views.push(InputView {
            output: k,
            input,
            view: t.view.clone(),
        });
    }
    Ok(CapturedGraph {
        client: client.clone(),
        device_index: state.device_index,
        graph: ran.graph,
        exe: ran.exe,
        params,
        donors,
        written,
        input_views,
        num_inputs: state.inputs.len(),
        num_outputs: outputs.len(),
        chained: ran.upstream.is_some(),
        checks: ran.checks,
        kept_on_failure: ran.kept_on_failure,
        ops: ran.ops,
        site,
    })
}

impl CapturedGraph {
    /// A replay in deferred mode: the graph joins the pending one (so a
    /// compiled forward, backward and optimizer step inside `rtpu.step()`
    /// run as one program).
    fn record(&self, inputs: &[TensorArg]) -> Result<Vec<Output>> {
        let params = self
            .params
            .iter()
            .map(|binding| match binding {
                Binding::Input(i) => SplicedParam::Storage {
                    storage: inputs[*i].storage.clone(),
                    view: inputs[*i].view.clone(),
                },
                // The step's flush checks all earlier graphs first.
                Binding::Fixed(buffer) | Binding::Upstream(buffer) => {
                    SplicedParam::Buffer(buffer.clone())
                }
                Binding::Host { bytes, dtype, dims } => SplicedParam::Host {
                    bytes: bytes.clone(),
                    dtype: *dtype,
                    dims: dims.clone(),
                },
            })
            .collect();
        let mut bound: Vec<CapturedOutput> = self
            .written
            .iter()
            .map(|written| match written {
                Written::Input(i) => CapturedOutput::Into(inputs[*i].storage.clone()),
                Written::Outputs(_) => CapturedOutput::New,
                Written::Dropped => CapturedOutput::Dropped,
            })
            .collect();
        bound.extend(
            self.checks
                .iter()
                .map(|(error, _)| CapturedOutput::Check(error.clone())),
        );
        if self.chained {
            bound.push(CapturedOutput::Dropped);
        }
        let created = deferred::record_captured(
            &self.client,
            self.device_index,
            &self.graph,
            params,
            bound,
            "rtpu::captured_graph",
        )?;
        let mut created = created.into_iter();
        let mut outputs: Vec<Option<Output>> = (0..self.num_outputs).map(|_| None).collect();
        for written in &self.written {
            if let Written::Outputs(views) = written {
                let storage = created.next().ok_or_else(|| {
                    Error::invalid(
                        "recorded captured graph outputs",
                        "one per new value",
                        "fewer",
                    )
                })?;
                place(&storage, views, &mut outputs);
            }
        }
        self.alias_inputs(inputs, &mut outputs);
        complete(outputs)
    }

    /// Outputs that are (views of) inputs share the inputs' storages.
    fn alias_inputs(&self, inputs: &[TensorArg], outputs: &mut [Option<Output>]) {
        for alias in &self.input_views {
            outputs[alias.output] = Some(Output::New {
                storage: inputs[alias.input].storage.clone(),
                view: alias.view.clone(),
            });
        }
    }

    /// How many inputs a replay takes.
    pub fn num_inputs(&self) -> usize {
        self.num_inputs
    }

    /// Runs the graph on `inputs` (the same shapes, dtypes and layouts as at
    /// capture): returns its outputs and writes the inputs it mutates.
    pub fn replay(&self, inputs: &[TensorArg]) -> Result<Vec<Output>> {
        if inputs.len() != self.num_inputs {
            return Err(Error::invalid(
                "captured graph inputs",
                self.num_inputs,
                inputs.len(),
            ));
        }
        for (i, input) in inputs.iter().enumerate() {
            if input.storage.device_index() != self.device_index {
                return Err(Error::invalid(
                    format!("captured graph input {i}"),
                    format!("a tensor on tpu:{}", self.device_index),
                    format!("one on tpu:{}", input.storage.device_index()),
                ));
            }
        }
        if mode::current() == Mode::Deferred {
            return self.record(inputs);
        }
        // An earlier graph's failed check means these inputs may be wrong:
        // a chained program keeps its storages' old values then, otherwise
        // the check is read first.
        let upstream = match self.chained {
            true => checks::upstream_flag(&self.client, self.device_index)?,
            false => {
                checks::verify_checks()?;
                None
            }
        };
        let mut input_buffers = Vec::with_capacity(inputs.len());
        let mut sharded = false;
        for input in inputs {
            input_buffers.push(match input.storage.value()? {
                StorageValue::Buffer { buffer, .. } => Some(buffer),
                StorageValue::Sharded { .. } => {
                    sharded = true;
                    None
                }
                _ => None,
            });
        }
        let exe = match &self.exe {
            Some(exe) if !sharded => exe,
            // An SPMD program over the inputs' mesh (compiled and cached
            // as any pending graph), run now.
            _ => {
                let outputs = self.record(inputs)?;
                deferred::flush_device(&self.client, self.device_index)?;
                return Ok(outputs);
            }
        };
        let device = self.client.device(self.device_index)?;
        let mut args: Vec<Arc<Buffer>> = Vec::with_capacity(self.params.len());
        for binding in &self.params {
            args.push(match binding {
                Binding::Input(i) => input_buffers[*i].clone().ok_or_else(|| {
                    Error::invalid(
                        format!("captured graph input {i}"),
                        "a tensor with a value",
                        "a never-written storage",
                    )
                })?,
                Binding::Fixed(buffer) => buffer.clone(),
                Binding::Upstream(none_failed) => {
                    upstream.clone().unwrap_or_else(|| none_failed.clone())
                }
                Binding::Host { bytes, dtype, dims } => host_input(
                    &self.client,
                    self.device_index,
                    &device,
                    bytes,
                    *dtype,
                    dims,
                )?,
            });
        }
        // Held by its storage and `args` only: no one reads the old value.
        drop(input_buffers);
        let donate: Vec<usize> = self
            .donors
            .iter()
            .copied()
            .filter(|&p| Arc::strong_count(&args[p]) == 2)
            .collect();
        let mut buffers = launch::launch(&self.client, self.device_index, exe, &args, &donate)?;
        metrics::add(Metric::GraphExecutions, 1);
        metrics::add(Metric::BuffersDonated, donate.len() as u64);
        let expected = self.written.len() + self.checks.len() + usize::from(self.chained);
        if buffers.len() != expected {
            return Err(Error::invalid(
                "outputs of a captured graph",
                expected,
                buffers.len(),
            ));
        }
        let chained_flag = match self.chained {
            true => buffers.pop().map(Arc::new),
            false => None,
        };
        let flags = buffers.split_off(self.written.len());
        let mut outputs: Vec<Option<Output>> = (0..self.num_outputs).map(|_| None).collect();
        let mut written_storages = Vec::new();
        let mut latest = Vec::new();
        let mut on_failure = Vec::new();
        for ((written, buffer), &kept) in
            self.written.iter().zip(buffers).zip(&self.kept_on_failure)
        {
            let dtype = buffer.dtype()?;
            match written {
                Written::Input(i) => {
                    let storage = &inputs[*i].storage;
                    let before = storage.recorded_value();
                    storage.set_value(buffer, dtype)?;
                    if let StorageValue::Buffer { buffer, .. } = storage.recorded_value() {
                        latest.push(Arc::downgrade(&buffer));
                    }
                    written_storages.push(storage.clone());
                    on_failure.push(match kept {
                        true => OnFailure::keep(Some(&before)),
                        false => OnFailure::Restore(before),
                    });
                }
                Written::Outputs(views) => {
                    let storage =
                        Storage::from_buffer(&self.client, self.device_index, buffer, dtype)?;
                    if let StorageValue::Buffer { buffer, .. } = storage.recorded_value() {
                        latest.push(Arc::downgrade(&buffer));
                    }
                    place(&storage, views, &mut outputs);
                    written_storages.push(storage);
                    on_failure.push(OnFailure::Lose);
                }
                Written::Dropped => {}
            }
        }
        self.alias_inputs(inputs, &mut outputs);
        // Registered when a check may fail: its own, or one before it that
        // would undo it too.
        let chain = chained_flag
            .filter(|_| upstream.is_some() || !flags.is_empty())
            .map(|flag| ((self.client.id(), self.device_index), flag));
        checks::watch_checks(
            checks::Ran {
                site: self.site,
                ops: &self.ops,
                flags,
                checks: &self.checks,
                written: &written_storages,
                latest: &latest,
                on_failure,
            },
            chain,
        );
        complete(outputs)
    }
}

/// Returns `storage` as the outputs at these (index, view) positions.
fn place(storage: &Arc<Storage>, views: &[(usize, View)], outputs: &mut [Option<Output>]) {
    for (k, view) in views {
        outputs[*k] = Some(Output::New {
            storage: storage.clone(),
            view: view.clone(),
        });
    }
}

/// The outputs, every position filled.
fn complete(outputs: Vec<Option<Output>>) -> Result<Vec<Output>> {
    outputs
        .into_iter()
        .map(|o| {
            o.ok_or_else(|| Error::invalid("captured graph outputs", "all bound", "one unbound"))
        })
        .collect()
}
