//! Collectives across the devices of this process.
//!
//! A `Communicator` spans some devices of one client; rank `r` is
//! `devices[r]`. Each rank (usually its own thread) submits its part of a
//! collective and gets a `Work` at once. When every rank has submitted the
//! collective with that sequence number, one XLA program with a replica per
//! device runs it (StableHLO `all_reduce`, `all_gather`, ...), and each
//! rank's work hands back its result. Ranks that disagree (another
//! collective, dtype or shape) all get the same error naming each rank's
//! call; a rank that does not come within a waiter's timeout fails the
//! collective for every rank. Nothing aborts and nothing waits for ever.
//!
//! Across processes, a `ProcessGroup` stages each collective through host
//! memory over an embedder's `HostTransport` (`process.rs`).

mod process;
mod program;

pub use process::{HostTransport, ProcessGroup};

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client, ExecuteOptions, LoadedExecutable};

/// How `AllReduce` and `ReduceScatter` combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the number of ranks (floating-point dtypes only).
    Avg,
    Min,
    Max,
    Prod,
}

/// A collective, as every rank of a communicator calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the ranks' tensors combined with the op.
    AllReduce(ReduceOp),
    /// Every rank gets the ranks' tensors concatenated along dim 0.
    AllGather,
    /// The combined tensor split along dim 0: rank `r` gets piece `r`.
    ReduceScatter(ReduceOp),
    /// Each tensor split along dim 0: rank `r` gets piece `r` of each rank's,
    /// concatenated in rank order.
    AllToAll,
    /// Every rank gets rank `root`'s tensor.
    Broadcast { root: usize },
    /// Returns once every rank has called it; no tensor.
    Barrier,
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Collective::AllReduce(op) => write!(f, "all_reduce({op:?})"),
            Collective::AllGather => f.write_str("all_gather"),
            Collective::ReduceScatter(op) => write!(f, "reduce_scatter({op:?})"),
            Collective::AllToAll => f.write_str("all_to_all"),
            Collective::Broadcast { root } => write!(f, "broadcast(root {root})"),
            Collective::Barrier => f.write_str("barrier"),
        }
    }
}

/// One rank's tensor: a dense buffer on the rank's device, read as `dims`.
#[derive(Clone)]
pub struct Tensor {
    pub buffer: Arc<Buffer>,
    pub dtype: DType,
    pub dims: Vec<i64>,
}

/// What one rank submitted.
struct Part {
    collective: Collective,
    tensor: Option<Tensor>,
}

impl Part {
    fn describe(&self) -> String {
        match &self.tensor {
            Some(t) => format!("{} of {}{:?}", self.collective, t.dtype, t.dims),
            None => self.collective.to_string(),
        }
    }
}

/// Per rank: its result (None for a barrier); or the failure every rank gets.
type Outcome = std::result::Result<Vec<Option<Buffer>>, (ErrorCode, String)>;

/// The collective with one sequence number.
struct Round {
    parts: Vec<Option<Part>>,
    /// Set once every rank submitted and the program was launched.
    running: bool,
    outcome: Option<Outcome>,
    /// Ranks whose work has not taken its outcome yet.
    waiting: Vec<bool>,
}

impl Round {
    fn new(size: usize) -> Round {
        Round {
            parts: (0..size).map(|_| None).collect(),
            running: false,
            outcome: None,
            waiting: vec![true; size],
        }
    }

    fn missing(&self) -> Vec<usize> {
        (0..self.parts.len())
            .filter(|&r| self.parts[r].is_none())
            .collect()
    }
}

#[derive(Default)]
struct Rounds {
    /// Per rank, the sequence number of its next collective.
    next: Vec<u64>,
    open: HashMap<u64, Round>,
}

/// Programs by (collective, dtype, the buffers' dims, the tensors' dims).
type ProgramKey = (Collective, DType, Vec<i64>, Vec<i64>);

/// A group of devices of one client that run collectives together.
pub struct Communicator {
    client: Client,
    devices: Vec<usize>,
    rounds: Mutex<Rounds>,
    changed: Condvar,
    programs: Mutex<HashMap<ProgramKey, Arc<LoadedExecutable>>>,
}

impl Communicator {
    /// A communicator whose rank `r` is device `devices[r]` of `client`.
    pub fn local(client: &Client, devices: &[usize]) -> Result<Arc<Communicator>> {
        if devices.is_empty() {
            return Err(Error::invalid("devices", "at least one device", "none"));
        }
        for (rank, &device) in devices.iter().enumerate() {
            if device >= client.device_count() {
                return Err(Error::invalid(
                    format!("devices[{rank}]"),
                    format!("a device index below {}", client.device_count()),
                    device,
                ));
            }
            if devices[..rank].contains(&device) {
                return Err(Error::invalid(
                    format!("devices[{rank}]"),
                    "each device once",
                    format!("device {device} again"),
                ));
            }
        }
        Ok(Arc::new(Communicator {
            client: client.clone(),
            devices: devices.to_vec(),
            rounds: Mutex::new(Rounds {
                next: vec![0; devices.len()],
                open: HashMap::new(),
            }),
            changed: Condvar::new(),
            programs: Mutex::default(),
        }))
    }

    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The device index of `rank`.
    pub fn device(&self, rank: usize) -> Option<usize> {
        self.devices.get(rank).copied()
    }

    /// The PJRT device id of each rank's device.
    fn device_ids(&self) -> Result<Vec<i64>> {
        self.devices
            .iter()
            .map(|&d| Ok(i64::from(self.client.device(d)?.id()?)))
            .collect()
    }

    fn rounds(&self) -> MutexGuard<'_, Rounds> {
        self.rounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank`'s part of its next collective; `tensor` is None only for
    /// a barrier. Checks what this rank alone can check now; what the ranks
    /// must agree on is checked when the last one arrives.
    pub fn submit(
        self: &Arc<Self>,
        rank: usize,
        collective: Collective,
        tensor: Option<Tensor>,
    ) -> Result<Work> {
        let size = self.size();
        if rank >= size {
            return Err(Error::invalid(
                "rank",
                format!("below the communicator's size {size}"),
                rank,
            ));
        }
        self.check_part(rank, collective, tensor.as_ref())?;
        let mut rounds = self.rounds();
        let sequence = rounds.next[rank];
        rounds.next[rank] += 1;
        let round = rounds
            .open
            .entry(sequence)
            .or_insert_with(|| Round::new(size));
        round.parts[rank] = Some(Part { collective, tensor });
        let all_here = round.missing().is_empty() && round.outcome.is_none();
        if all_here {
            round.running = true;
            let parts: Vec<Part> = round.parts.iter_mut().filter_map(Option::take).collect();
            drop(rounds);
            let outcome = self.run(&parts).map_err(|e| {
                (
                    e.code(),
                    format!("{} #{sequence}: {e}", parts[0].collective),
                )
            });
            let mut rounds = self.rounds();
            if let Some(round) = rounds.open.get_mut(&sequence) {
                round.outcome = Some(outcome);
                forget_absent(&mut rounds, sequence);
            }
            self.changed.notify_all();
        }
        Ok(Work {
            comm: self.clone(),
            sequence,
            rank,
            done: false,
        })
    }

    fn check_part(
        &self,
        rank: usize,
        collective: Collective,
        tensor: Option<&Tensor>,
    ) -> Result<()> {
        let what = |field: &str| format!("{collective} on rank {rank}: {field}");
        let Some(tensor) = tensor else {
            return match collective {
                Collective::Barrier => Ok(()),
                _ => Err(Error::invalid(what("tensor"), "a tensor", "none")),
            };
        };
        if let Collective::Broadcast { root } = collective {
            if root >= self.size() {
                return Err(Error::invalid(
                    what("root"),
                    format!("a rank below {}", self.size()),
                    root,
                ));
            }
        }
        let on = tensor.buffer.device()?.id()?;
        let expected = self.client.device(self.devices[rank])?.id()?;
        if on != expected {
            return Err(Error::invalid(
                what("tensor"),
                format!("a tensor on the rank's device tpu:{}", self.devices[rank]),
                format!("one on the device with id {on}"),
            ));
        }
        program::check_supported(collective, tensor.dtype, &tensor.dims, self.size()).map_err(
            |reason| {
                Error::invalid(
                    what("tensor"),
                    reason,
                    format!("{}{:?}", tensor.dtype, tensor.dims),
                )
            },
        )
    }

    /// Runs one collective whose parts all arrived (in rank order).
    fn run(&self, parts: &[Part]) -> Result<Vec<Option<Buffer>>> {
        let first = &parts[0];
        let agree = parts.iter().all(|p| {
            p.collective == first.collective
                && match (&p.tensor, &first.tensor) {
                    (Some(a), Some(b)) => a.dtype == b.dtype && a.dims == b.dims,
                    (None, None) => true,
                    _ => false,
                }
        });
        if !agree {
            let said: Vec<String> = parts
                .iter()
                .enumerate()
                .map(|(rank, p)| format!("rank {rank} called {}", p.describe()))
                .collect();
            return Err(Error::invalid(
                "a collective",
                "every rank calling it with the same dtype and shape",
                said.join("; "),
            ));
        }
        let size = self.size();
        let program = self.program(first)?;
        // The program lists its devices in its own order: each one's rank.
        let ids = self.device_ids()?;
        let ranks = program
            .devices()
            .iter()
            .map(|device| {
                let id = i64::from(device.id()?);
                ids.iter().position(|&i| i == id).ok_or_else(|| {
                    Error::invalid("a collective's program", "devices of the communicator", id)
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let args: Vec<Vec<&Buffer>> = ranks
            .iter()
            .map(|&rank| match &parts[rank].tensor {
                Some(t) => vec![t.buffer.as_ref()],
                None => Vec::new(),
            })
            .collect();
        let rows: Vec<&[&Buffer]> = args.iter().map(Vec::as_slice).collect();
        let start = Instant::now();
        let outputs = program.execute(
            &rows,
            &ExecuteOptions {
                donate: Vec::new(),
                asynchronous: true,
            },
        )?;
        metrics::add_elapsed(Metric::ExecuteNs, start);
        metrics::add(Metric::CollectivesRun, 1);
        let bytes: usize = parts
            .iter()
            .filter_map(|p| p.tensor.as_ref())
            .map(|t| t.buffer.on_device_size().unwrap_or(0))
            .sum();
        metrics::add(Metric::CollectiveBytes, bytes as u64);
        // Back in rank order.
        let mut results: Vec<Option<Buffer>> = (0..size).map(|_| None).collect();
        for (&rank, mut outputs) in ranks.iter().zip(outputs) {
            if first.collective != Collective::Barrier {
                results[rank] = outputs.pop();
            }
        }
        Ok(results)
    }

    fn program(&self, part: &Part) -> Result<Arc<LoadedExecutable>> {
        let (dtype, stored, dims) = match &part.tensor {
            Some(t) => (t.dtype, t.buffer.dims()?, t.dims.clone()),
            None => (DType::I32, Vec::new(), Vec::new()),
        };
        let key = (part.collective, dtype, stored.clone(), dims.clone());
        if let Some(program) = self
            .programs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(program.clone());
        }
        let program = Arc::new(program::compile(
            &self.client,
            part.collective,
            dtype,
            &stored,
            &dims,
            &self.device_ids()?,
        )?);
        self.programs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, program.clone());
        Ok(program)
    }
}

/// Drops the round once no rank waits for it any more.
fn forget_absent(rounds: &mut Rounds, sequence: u64) {
    let finished = rounds
        .open
        .get(&sequence)
        .is_some_and(|r| r.outcome.is_some() && !r.waiting.iter().any(|&w| w));
    if finished {
        rounds.open.remove(&sequence);
    }
}

/// One rank's pending collective.
pub struct Work {
    comm: Arc<Communicator>,
    sequence: u64,
    rank: usize,
    done: bool,
}

impl Work {
    /// The device index of the work's rank, where its result lives.
    pub fn device_index(&self) -> usize {
        self.comm.devices[self.rank]
    }

    /// Waits up to `timeout` for the collective and returns this rank's
    /// result (None for a barrier). On timeout the collective fails for
    /// every rank (naming the ranks that never came), and a later wait on
    /// any rank's work returns that error.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<Buffer>> {
        if self.done {
            return Err(Error::invalid(
                "work",
                "a work not waited for yet",
                "one already waited for",
            ));
        }
        let deadline = Instant::now() + timeout;
        let mut rounds = self.comm.rounds();
        loop {
            let Some(round) = rounds.open.get_mut(&self.sequence) else {
                return Err(Error::invalid(
                    "work",
                    "an open collective",
                    "a finished one",
                ));
            };
            if let Some(outcome) = &mut round.outcome {
                let result = match outcome {
                    Ok(results) => Ok(results[self.rank].take()),
                    Err((code, message)) => Err(Error::Collective {
                        code: *code,
                        message: message.clone(),
                    }),
                };
                round.waiting[self.rank] = false;
                self.done = true;
                forget_absent(&mut rounds, self.sequence);
                return result;
            }
            let now = Instant::now();
            if now >= deadline && !round.running {
                let missing: Vec<String> = round.missing().iter().map(usize::to_string).collect();
                round.outcome = Some(Err((
                    ErrorCode::DeadlineExceeded,
                    format!(
                        "collective #{}: rank {} waited {timeout:?} for ranks [{}], which never called it",
                        self.sequence,
                        self.rank,
                        missing.join(", ")
                    ),
                )));
                self.comm.changed.notify_all();
                continue;
            }
            let wait = deadline
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            rounds = self
                .comm
                .changed
                .wait_timeout(rounds, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if self.done || std::thread::panicking() {
            return;
        }
        let mut rounds = self.comm.rounds();
        if let Some(round) = rounds.open.get_mut(&self.sequence) {
            round.waiting[self.rank] = false;
            if let Some(Ok(results)) = &mut round.outcome {
                results[self.rank] = None;
            }
        }
        forget_absent(&mut rounds, self.sequence);
    }
}
