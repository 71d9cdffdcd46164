//! Collectives across processes through the host: for plugins that cannot
//! run XLA collectives across processes (no CPU plugin can), each rank's
//! tensor goes to host memory, an embedder's transport (gloo, MPI, its own)
//! moves the bytes, and the result comes back to the device.

use std::sync::{Arc, Mutex};

use half::{bf16, f16};

use super::program::check_supported;
use super::{Collective, ReduceOp, Tensor};
use crate::dtype::DType;
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::{self, Metric};
use crate::runtime::{Buffer, Client};

/// Moves bytes between the processes of a group; every rank calls each
/// method in the same order. An error is a message; a transport that can
/// hang must give up after its own timeout and say so.
pub trait HostTransport: Send + Sync {
    /// `data` (elements of `dtype`) combined with `op` over the ranks, in place.
    /// `op` is never `Avg` (rtpu divides the sum).
    fn all_reduce(
        &self,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> std::result::Result<(), String>;
    /// Every rank's `input` into `output` (`input.len() * size` bytes), in rank order.
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> std::result::Result<(), String>;
    /// Piece `r` of `input` (split into `size` equal pieces) to rank `r`;
    /// `output` gets piece `rank` of every rank's input, in rank order.
    fn all_to_all(&self, input: &[u8], output: &mut [u8]) -> std::result::Result<(), String>;
    /// Rank `root`'s `data` into every rank's `data`.
    fn broadcast(&self, data: &mut [u8], root: usize) -> std::result::Result<(), String>;
    fn barrier(&self) -> std::result::Result<(), String>;
}

/// One rank of a group of processes, on one device of this process.
pub struct ProcessGroup {
    client: Client,
    device: usize,
    rank: usize,
    size: usize,
    transport: Box<dyn HostTransport>,
    /// The next collective's sequence number (ranks agree on it).
    sequence: Mutex<u64>,
}

/// What each rank says it is calling, exchanged before any payload: its
/// sequence number and a hash of the collective, dtype and dims.
const RECORD_BYTES: usize = 16;

impl ProcessGroup {
    pub fn new(
        client: &Client,
        device: usize,
        rank: usize,
        size: usize,
        transport: Box<dyn HostTransport>,
    ) -> Result<Arc<ProcessGroup>> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(
                "rank",
                format!("below the world size {size}"),
                rank,
            ));
        }
        if device >= client.device_count() {
            return Err(Error::invalid(
                "device",
                format!("a device index below {}", client.device_count()),
                device,
            ));
        }
        Ok(Arc::new(ProcessGroup {
            client: client.clone(),
            device,
            rank,
            size,
            transport,
            sequence: Mutex::new(0),
        }))
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn device(&self) -> usize {
        self.device
    }

    /// Runs this rank's part of `collective` on `tensor` (None only for a
    /// barrier) and returns its result, once every rank's transport call
    /// returned.
    pub fn run(&self, collective: Collective, tensor: Option<Tensor>) -> Result<Option<Buffer>> {
        let mut sequence = self.sequence.lock().unwrap_or_else(|p| p.into_inner());
        let what = format!("{collective} #{} on rank {}", *sequence, self.rank);
        let fail = |message: String| Error::Collective {
            code: ErrorCode::Internal,
            message: format!("{what}: {message}"),
        };
        if let Some(t) = &tensor {
            check_supported(collective, t.dtype, &t.dims, self.size).map_err(|reason| {
                Error::invalid(
                    format!("{what}: tensor"),
                    reason,
                    format!("{}{:?}", t.dtype, t.dims),
                )
            })?;
            if t.buffer.device()?.id()? != self.client.device(self.device)?.id()? {
                return Err(Error::invalid(
                    format!("{what}: tensor"),
                    format!("a tensor on the group's device tpu:{}", self.device),
                    "one on another device",
                ));
            }
        } else if collective != Collective::Barrier {
            return Err(Error::invalid(
                format!("{what}: tensor"),
                "a tensor",
                "none",
            ));
        }
        self.agree(*sequence, collective, tensor.as_ref())
            .map_err(|e| match e {
                Disagreement::Transport(message) => fail(message),
                Disagreement::Ranks(said) => Error::Collective {
                    code: ErrorCode::InvalidArgument,
                    message: format!("{what}: the ranks disagree: {said}"),
                },
            })?;
        *sequence += 1;
        let Some(tensor) = tensor else {
            self.transport.barrier().map_err(fail)?;
            return Ok(None);
        };
        let input = tensor.buffer.to_host()?;
        metrics::add(Metric::DeviceToHostBytes, input.len() as u64);
        let (output, dims) = match collective {
            Collective::AllReduce(op) | Collective::ReduceScatter(op) => {
                let mut data = input;
                let summed = if op == ReduceOp::Avg {
                    ReduceOp::Sum
                } else {
                    op
                };
                self.transport
                    .all_reduce(&mut data, tensor.dtype, summed)
                    .map_err(fail)?;
                if op == ReduceOp::Avg {
                    divide(&mut data, tensor.dtype, self.size);
                }
                if let Collective::ReduceScatter(_) = collective {
                    let piece = data.len() / self.size;
                    let mut dims = tensor.dims.clone();
                    dims[0] /= self.size as i64;
                    (
                        data[self.rank * piece..(self.rank + 1) * piece].to_vec(),
                        dims,
                    )
                } else {
                    (data, tensor.dims.clone())
                }
            }
            Collective::AllGather => {
                let mut output = vec![0u8; input.len() * self.size];
                self.transport
                    .all_gather(&input, &mut output)
                    .map_err(fail)?;
                let mut dims = tensor.dims.clone();
                dims[0] *= self.size as i64;
                (output, dims)
            }
            Collective::AllToAll => {
                let mut output = vec![0u8; input.len()];
                self.transport
                    .all_to_all(&input, &mut output)
                    .map_err(fail)?;
                (output, tensor.dims.clone())
            }
            Collective::Broadcast { root } => {
                let mut data = input;
                self.transport.broadcast(&mut data, root).map_err(fail)?;
                (data, tensor.dims.clone())
            }
            Collective::Barrier => unreachable!("no tensor"),
        };
        metrics::add(Metric::CollectivesRun, 1);
        metrics::add(Metric::CollectiveBytes, output.len() as u64);
        metrics::add(Metric::HostToDeviceBytes, output.len() as u64);
        let device = self.client.device(self.device)?;
        // A storage's buffer is flat, whatever the tensor's dims.
        Ok(Some(self.client.buffer_from_host(
            &output,
            tensor.dtype,
            &[dims.iter().product::<i64>()],
            &device,
        )?))
    }

    /// Every rank calls the same collective with the same sequence number,
    /// dtype and dims; the records all ranks exchanged say who called what.
    fn agree(
        &self,
        sequence: u64,
        collective: Collective,
        tensor: Option<&Tensor>,
    ) -> std::result::Result<(), Disagreement> {
        let described = match tensor {
            Some(t) => format!("{collective} of {}{:?}", t.dtype, t.dims),
            None => collective.to_string(),
        };
        let mut record = [0u8; RECORD_BYTES];
        record[..8].copy_from_slice(&sequence.to_le_bytes());
        record[8..].copy_from_slice(&fnv1a(described.as_bytes()).to_le_bytes());
        let mut records = vec![0u8; RECORD_BYTES * self.size];
        self.transport
            .all_gather(&record, &mut records)
            .map_err(Disagreement::Transport)?;
        if records.chunks(RECORD_BYTES).all(|r| r == record) {
            return Ok(());
        }
        // Only hashes travelled: name what this rank called and which ranks differ.
        let differ: Vec<String> = records
            .chunks(RECORD_BYTES)
            .enumerate()
            .filter(|(_, r)| *r != record)
            .map(|(rank, _)| rank.to_string())
            .collect();
        Err(Disagreement::Ranks(format!(
            "rank {} called {described}, ranks [{}] called something else",
            self.rank,
            differ.join(", ")
        )))
    }
}

enum Disagreement {
    Transport(String),
    Ranks(String),
}

/// A stable 64-bit hash (FNV-1a): the same on every rank and build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Divides floating-point elements of `dtype` in place by `by`.
fn divide(data: &mut [u8], dtype: DType, by: usize) {
    let by = by as f64;
    match dtype {
        DType::F32 => data.chunks_exact_mut(4).for_each(|c| {
            let v = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) / by as f32;
            c.copy_from_slice(&v.to_ne_bytes());
        }),
        DType::F64 => data.chunks_exact_mut(8).for_each(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            c.copy_from_slice(&(f64::from_ne_bytes(b) / by).to_ne_bytes());
        }),
        DType::F16 => data.chunks_exact_mut(2).for_each(|c| {
            let v = f16::from_ne_bytes([c[0], c[1]]).to_f64() / by;
            c.copy_from_slice(&f16::from_f64(v).to_ne_bytes());
        }),
        DType::BF16 => data.chunks_exact_mut(2).for_each(|c| {
            let v = bf16::from_ne_bytes([c[0], c[1]]).to_f64() / by;
            c.copy_from_slice(&bf16::from_f64(v).to_ne_bytes());
        }),
        // check_supported allows Avg on floating-point dtypes only.
        _ => {}
    }
}
