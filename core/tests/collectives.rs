//! Collectives over the four devices of the CPU client, each rank on its own
//! thread as a data-parallel program would call them; results against the
//! same reduction on the host.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{assert_close, f32_bytes, f32s_from, Rng};
use rtpu_core::dist::{Collective, Communicator, ReduceOp, Tensor};
use rtpu_core::runtime::Client;
use rtpu_core::{DType, ErrorCode};

const RANKS: usize = 4;
// Sums of four values in another order than the host's: float32 rounding.
const RTOL: f32 = 1e-6;
const ATOL: f32 = 1e-6;
const TIMEOUT: Duration = Duration::from_secs(60);

fn tensor(client: &Client, device: usize, values: &[f32], dims: &[i64]) -> Tensor {
    let buffer = client
        .buffer_from_host(
            &f32_bytes(values),
            DType::F32,
            dims,
            &client.device(device).unwrap(),
        )
        .unwrap();
    Tensor {
        buffer: Arc::new(buffer),
        dtype: DType::F32,
        dims: dims.to_vec(),
    }
}

/// Runs `collective` with `inputs[r]` (of `dims`) on rank r's thread and
/// returns each rank's result.
fn on_every_rank(
    comm: &Arc<Communicator>,
    collective: Collective,
    inputs: &[Vec<f32>],
    dims: &[i64],
) -> Vec<Vec<f32>> {
    let client = common::cpu_client();
    thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(rank, values)| {
                let comm = comm.clone();
                scope.spawn(move || {
                    let t = tensor(client, comm.device(rank).unwrap(), values, dims);
                    let mut work = comm.submit(rank, collective, Some(t)).unwrap();
                    let out = work.wait(TIMEOUT).unwrap().expect("a result");
                    f32s_from(&out.to_host().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

type HostOp = fn(f32, f32) -> f32;

fn combine(inputs: &[Vec<f32>], f: impl Fn(f32, f32) -> f32) -> Vec<f32> {
    (0..inputs[0].len())
        .map(|i| inputs[1..].iter().fold(inputs[0][i], |acc, v| f(acc, v[i])))
        .collect()
}

#[test]
fn every_collective_matches_the_host_from_four_threads() {
    let client = common::cpu_client();
    // Ranks on devices in another order than their indices.
    let comm = Communicator::local(client, &[2, 0, 3, 1]).unwrap();
    let mut rng = Rng::fresh("collectives");
    let dims = [8, 3];
    let inputs: Vec<Vec<f32>> = (0..RANKS).map(|_| rng.f32s(24)).collect();
    let ops: [(ReduceOp, HostOp); 4] = [
        (ReduceOp::Sum, |a, b| a + b),
        (ReduceOp::Prod, |a, b| a * b),
        (ReduceOp::Min, f32::min),
        (ReduceOp::Max, f32::max),
    ];
    for (op, f) in ops {
        let want = combine(&inputs, f);
        for got in on_every_rank(&comm, Collective::AllReduce(op), &inputs, &dims) {
            assert_close(&got, &want, RTOL, ATOL);
        }
    }
    let mean: Vec<f32> = combine(&inputs, |a, b| a + b)
        .iter()
        .map(|s| s / RANKS as f32)
        .collect();
    for got in on_every_rank(&comm, Collective::AllReduce(ReduceOp::Avg), &inputs, &dims) {
        assert_close(&got, &mean, RTOL, ATOL);
    }
    let gathered: Vec<f32> = inputs.concat();
    for got in on_every_rank(&comm, Collective::AllGather, &inputs, &dims) {
        assert_eq!(got, gathered);
    }
    // 8 rows over 4 ranks: rank r gets rows 2r and 2r + 1 (6 values).
    let sum = combine(&inputs, |a, b| a + b);
    for (rank, got) in on_every_rank(
        &comm,
        Collective::ReduceScatter(ReduceOp::Sum),
        &inputs,
        &dims,
    )
    .iter()
    .enumerate()
    {
        assert_close(got, &sum[rank * 6..(rank + 1) * 6], RTOL, ATOL);
    }
    for (rank, got) in on_every_rank(&comm, Collective::AllToAll, &inputs, &dims)
        .iter()
        .enumerate()
    {
        let want: Vec<f32> = inputs
            .iter()
            .flat_map(|v| v[rank * 6..(rank + 1) * 6].to_vec())
            .collect();
        assert_eq!(got, &want);
    }
    for got in on_every_rank(&comm, Collective::Broadcast { root: 2 }, &inputs, &dims) {
        assert_eq!(got, inputs[2]);
    }
    // A barrier returns no tensor on every rank.
    thread::scope(|scope| {
        for rank in 0..RANKS {
            let comm = comm.clone();
            scope.spawn(move || {
                let mut work = comm.submit(rank, Collective::Barrier, None).unwrap();
                assert!(work.wait(TIMEOUT).unwrap().is_none());
            });
        }
    });
}

#[test]
fn ranks_that_disagree_all_get_the_same_error() {
    let client = common::cpu_client();
    let comm = Communicator::local(client, &[0, 1, 2, 3]).unwrap();
    // Rank 3 passes 5 values where the others pass 4.
    let errors: Vec<String> = thread::scope(|scope| {
        let handles: Vec<_> = (0..RANKS)
            .map(|rank| {
                let comm = comm.clone();
                scope.spawn(move || {
                    let n = if rank == 3 { 5 } else { 4 };
                    let t = tensor(client, rank, &vec![1.0; n], &[n as i64]);
                    let mut work = comm
                        .submit(rank, Collective::AllReduce(ReduceOp::Sum), Some(t))
                        .unwrap();
                    let err = work.wait(TIMEOUT).unwrap_err();
                    assert_eq!(err.code(), ErrorCode::InvalidArgument);
                    err.to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errors.iter().all(|e| e == &errors[0]), "{errors:?}");
    assert!(
        errors[0].contains("rank 0 called all_reduce(Sum) of float32[4]")
            && errors[0].contains("rank 3 called all_reduce(Sum) of float32[5]"),
        "{}",
        errors[0]
    );
    // The communicator goes on: the next collective works.
    let inputs = vec![vec![1.0f32, 2.0]; RANKS];
    for got in on_every_rank(&comm, Collective::AllReduce(ReduceOp::Sum), &inputs, &[2]) {
        assert_eq!(got, vec![4.0, 8.0]);
    }
}

#[test]
fn a_rank_that_never_comes_fails_the_collective_for_every_rank_in_time() {
    let client = common::cpu_client();
    let comm = Communicator::local(client, &[0, 1, 2, 3]).unwrap();
    let timeout = Duration::from_millis(300);
    let mut works: Vec<_> = (0..3)
        .map(|rank| {
            let t = tensor(client, rank, &[1.0], &[1]);
            comm.submit(rank, Collective::AllReduce(ReduceOp::Sum), Some(t))
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let err = works[0].wait(timeout).unwrap_err();
    assert!(start.elapsed() < timeout + Duration::from_secs(5));
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(
        err.to_string()
            .contains("for ranks [3], which never called it"),
        "{err}"
    );
    // The other ranks get the same error at once; so does rank 3 if it
    // comes late.
    for work in &mut works[1..] {
        assert_eq!(work.wait(TIMEOUT).unwrap_err().to_string(), err.to_string());
    }
    let late = tensor(client, 3, &[1.0], &[1]);
    let mut work = comm
        .submit(3, Collective::AllReduce(ReduceOp::Sum), Some(late))
        .unwrap();
    assert_eq!(work.wait(TIMEOUT).unwrap_err().to_string(), err.to_string());
}

#[test]
fn bad_parts_are_refused_on_the_rank_that_passes_them() {
    let client = common::cpu_client();
    let comm = Communicator::local(client, &[0, 1]).unwrap();
    // Rank 0 submits `collective` on `part`; the error must say `expected`.
    let refused = |collective: Collective, part: Tensor, expected: &str| {
        let err = comm.submit(0, collective, Some(part)).err().unwrap();
        assert!(err.to_string().contains(expected), "{err}");
    };
    let on_device_1 = tensor(client, 1, &[1.0; 4], &[4]);
    refused(
        Collective::AllReduce(ReduceOp::Sum),
        on_device_1,
        "a tensor on the rank's device tpu:0",
    );
    let odd = tensor(client, 0, &[1.0; 3], &[3]);
    refused(
        Collective::ReduceScatter(ReduceOp::Sum),
        odd,
        "dim 0 divisible by the 2 ranks",
    );
    let t = tensor(client, 0, &[1.0; 4], &[4]);
    refused(
        Collective::Broadcast { root: 2 },
        t,
        "root: expected a rank below 2",
    );
    assert!(comm.submit(2, Collective::Barrier, None).is_err());
    assert!(comm.submit(0, Collective::AllGather, None).is_err());
    let ints = Tensor {
        buffer: Arc::new(
            client
                .buffer_from_host(&[0u8; 16], DType::I32, &[4], &client.device(0).unwrap())
                .unwrap(),
        ),
        dtype: DType::I32,
        dims: vec![4],
    };
    refused(
        Collective::AllReduce(ReduceOp::Avg),
        ints,
        "floating-point dtype for Avg",
    );
    assert!(Communicator::local(client, &[0, 0]).is_err());
    assert!(Communicator::local(client, &[9]).is_err());
    assert!(Communicator::local(client, &[]).is_err());
    // Refused parts took no sequence number: the ranks still pair up.
    let inputs = vec![vec![3.0f32]; 2];
    for got in on_every_rank(&comm, Collective::AllReduce(ReduceOp::Max), &inputs, &[1]) {
        assert_eq!(got, vec![3.0]);
    }
}
