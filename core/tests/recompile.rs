//! Compile counting needs a process of its own: the counters are global and
//! other tests would compile concurrently.

mod common;

use common::{assert_close, f32_bytes, f32s_from};
use rtpu_core::engine::{self, Arg, Output, TensorArg};
use rtpu_core::metrics::{self, Metric};
use rtpu_core::storage::{Storage, View};
use rtpu_core::DType;

#[test]
fn a_changing_scalar_does_not_recompile() {
    let client = common::cpu_client();
    let storage = Storage::new(client, 0, 8).unwrap();
    storage
        .write_host_bytes(&f32_bytes(&[1.0, 2.0]), DType::F32)
        .unwrap();
    let x = Arg::Tensor(TensorArg {
        storage,
        view: View::contiguous(&[2], DType::F32),
    });
    let mul = engine::find_op("aten::mul.Scalar").unwrap();
    let run = |scale: f64| match engine::call(client, mul, &[x.clone(), Arg::Float(scale)])
        .unwrap()
        .remove(0)
    {
        Output::New { storage, view } => f32s_from(&storage.read_view(&view).unwrap()),
        Output::Alias(_) | Output::None => panic!("mul.Scalar returns a new tensor"),
    };
    run(0.5);
    let compiled = metrics::value(Metric::ExecutablesCompiled);
    let hits = metrics::value(Metric::CacheHits);
    for step in 1..6 {
        let s = 0.1 * step as f32;
        assert_close(&run(s as f64), &[s, 2.0 * s], 1e-6, 0.0);
    }
    assert_eq!(metrics::value(Metric::ExecutablesCompiled), compiled);
    assert_eq!(metrics::value(Metric::CacheHits), hits + 5);
}
