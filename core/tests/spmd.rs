//! Sharded storages and SPMD programs on the real CPU plugin's 4 devices:
//! a storage split over a mesh reads back whole, ops on it run as one
//! program partitioned over the mesh (eagerly and deferred), and a storage
//! a step overwrites keeps its layout.

mod common;

use common::{assert_close, f32_tensor, f32s_from, host_matmul, Rng};
use rtpu_core::engine::{self, deferred, Arg, Output, TensorArg};
use rtpu_core::metrics::{self, Metric};
use rtpu_core::sharding::Sharding;
use rtpu_core::storage::View;
use rtpu_core::DType;

const MESH: [usize; 4] = [0, 1, 2, 3];

/// The execution mode is the process's: tests that run ops take turns, so
/// the deferred one records nothing of the others.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

fn read(t: &TensorArg) -> Vec<f32> {
    f32s_from(&t.storage.read_view(&t.view).unwrap())
}

fn call(name: &str, args: &[Arg]) -> TensorArg {
    let op = engine::find_op(name).unwrap();
    match engine::call(common::cpu_client(), op, args)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .remove(0)
    {
        Output::New { storage, view } => TensorArg { storage, view },
        Output::Alias(i) => match &args[i] {
            Arg::Tensor(t) => t.clone(),
            _ => panic!("alias of a non-tensor"),
        },
        Output::None => panic!("{name} returned no tensor"),
    }
}

/// Rows split in 2, columns in 2: partition p holds tile (p / 2, p % 2).
fn two_by_two() -> Sharding {
    Sharding::new(vec![2, 2], 1, vec![0, 1, 2, 3], 4).unwrap()
}

/// An 8x6 tensor split 2x2 over the mesh, an unsharded one of `dims`, and
/// their values.
fn sharded_and_plain(seed: &str, dims: &[i64]) -> (TensorArg, Vec<f32>, TensorArg, Vec<f32>) {
    let mut rng = Rng::fresh(seed);
    let (a, b) = (
        rng.f32s(8 * 6),
        rng.f32s(dims.iter().product::<i64>() as usize),
    );
    let x = f32_tensor(&a, &[8, 6]);
    x.storage
        .shard(DType::F32, &MESH, &[8, 6], two_by_two())
        .unwrap();
    (x, a, f32_tensor(&b, dims), b)
}

#[test]
fn a_sharded_storage_reads_back_whole_and_holds_one_tile_per_device() {
    let _turn = one_at_a_time();
    let mut rng = Rng::fresh("spmd-roundtrip");
    let a = rng.f32s(8 * 6);
    let x = f32_tensor(&a, &[8, 6]);
    x.storage
        .shard(DType::F32, &MESH, &[8, 6], two_by_two())
        .unwrap();
    let shards = x.storage.shards().unwrap().expect("sharded");
    assert_eq!(shards.buffers.len(), 4);
    // Partition 1 holds rows 0..4, columns 3..6.
    let tile = f32s_from(&shards.buffers[1].to_host().unwrap());
    let want: Vec<f32> = (0..4)
        .flat_map(|r| (3..6).map(move |c| (r, c)))
        .map(|(r, c)| a[r * 6 + c])
        .collect();
    assert_eq!(tile, want);
    assert_eq!(read(&x), a);
    // A strided view of it reads through the gather too.
    let column = View {
        offset: 1,
        sizes: [8].into(),
        strides: [6].into(),
        dtype: DType::F32,
    };
    let got = f32s_from(&x.storage.read_view(&column).unwrap());
    assert_eq!(got, (0..8).map(|r| a[r * 6 + 1]).collect::<Vec<_>>());
}

#[test]
fn a_split_that_does_not_divide_or_names_no_device_is_refused() {
    let _turn = one_at_a_time();
    let x = f32_tensor(&[0.0; 12], &[6, 2]);
    let three_rows = Sharding::new(vec![4, 1], 1, vec![0, 1, 2, 3], 4).unwrap();
    assert!(x
        .storage
        .shard(DType::F32, &MESH, &[6, 2], three_rows)
        .is_err());
    let too_few = Sharding::new(vec![2, 1], 1, vec![0, 1], 2).unwrap();
    assert!(x.storage.shard(DType::F32, &[0], &[6, 2], too_few).is_err());
    assert!(x
        .storage
        .shard(DType::F32, &MESH, &[5, 2], two_by_two())
        .is_err());
    assert!(x.storage.shards().unwrap().is_none());
}

#[test]
fn an_eager_op_on_a_sharded_input_runs_partitioned_and_matches_the_host() {
    let _turn = one_at_a_time();
    let (x, a, w, b) = sharded_and_plain("spmd-eager", &[6, 4]);
    let before = metrics::value(Metric::SpmdExecutions);
    let y = call("aten::mm", &[Arg::Tensor(x.clone()), Arg::Tensor(w)]);
    assert!(metrics::value(Metric::SpmdExecutions) > before);
    assert!(
        y.storage.shards().unwrap().is_some(),
        "the result stays on the mesh"
    );
    assert_close(&read(&y), &host_matmul(&a, &b, 8, 6, 4), 1e-5, 1e-5);
}

#[test]
fn a_deferred_in_place_update_keeps_the_storages_layout() {
    let _turn = one_at_a_time();
    let (x, a, delta, b) = sharded_and_plain("spmd-deferred", &[8, 6]);
    deferred::set_deferred(true).unwrap();
    let updated = call(
        "aten::add_.Tensor",
        &[Arg::Tensor(x.clone()), Arg::Tensor(delta), Arg::Float(0.5)],
    );
    deferred::set_deferred(false).unwrap();
    assert!(std::sync::Arc::ptr_eq(&updated.storage, &x.storage));
    let shards = x.storage.shards().unwrap().expect("still sharded");
    assert_eq!(shards.sharding, two_by_two());
    assert_eq!(shards.dims, vec![8, 6]);
    let want: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + 0.5 * b).collect();
    assert_close(&read(&x), &want, 1e-6, 1e-6);
}

#[test]
fn an_unsharded_input_is_copied_to_the_mesh_once() {
    let _turn = one_at_a_time();
    let (x, _, w, b) = sharded_and_plain("spmd-replicated", &[6, 4]);
    let copied = || metrics::value(Metric::SpmdReplicatedBytes);
    let before = copied();
    let first = call(
        "aten::mm",
        &[Arg::Tensor(x.clone()), Arg::Tensor(w.clone())],
    );
    let once = copied() - before;
    assert_eq!(once, 3 * 6 * 4 * 4, "w copied to the 3 other devices");
    // w now lives on the mesh, replicated: the next program reads it there.
    let shards = w.storage.shards().unwrap().expect("on the mesh");
    assert_eq!(shards.sharding, Sharding::replicated(1, 4));
    let second = call("aten::mm", &[Arg::Tensor(x), Arg::Tensor(w.clone())]);
    assert_eq!(copied() - before, once);
    assert_eq!(read(&w), b);
    assert_eq!(read(&first), read(&second));
}
