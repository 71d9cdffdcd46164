//! The CPU plugin's host cache (`runtime::host_cache`) with the real plugin:
//! a freed large block is kept, handed out again with correct results, and
//! given back by `release`. A test binary of its own because it reads
//! process-wide metrics.

mod common;

use common::{assert_close, cpu_client, cpu_plugin_path, f32_bytes, f32s_from, Rng};
use rtpu_core::metrics::{self, Metric};
use rtpu_core::runtime::{host_cache, CompileOptions, ExecuteOptions};
use rtpu_core::DType;
use std::time::{Duration, Instant};

/// 2^20 f32: 4 MiB, the smallest block the cache keeps.
const ELEMENTS: usize = 1 << 20;
const BLOCK_BYTES: u64 = 4 << 20;

const AFFINE: &str = r#"
module @affine {
  func.func public @main(%x: tensor<1048576xf32>) -> tensor<1048576xf32> {
    %two = stablehlo.constant dense<2.0> : tensor<1048576xf32>
    %one = stablehlo.constant dense<1.0> : tensor<1048576xf32>
    %0 = stablehlo.multiply %x, %two : tensor<1048576xf32>
    %1 = stablehlo.add %0, %one : tensor<1048576xf32>
    return %1 : tensor<1048576xf32>
  }
}
"#;

#[test]
fn freed_large_blocks_are_reused_and_released() {
    let client = cpu_client();
    // The plugin imports posix_memalign and free; creating the client
    // pointed both at the cache, and installing again finds them again.
    assert!(host_cache::install(&cpu_plugin_path()) >= 2);
    let device = client.device(0).unwrap();
    let exe = client.compile(AFFINE, &CompileOptions::default()).unwrap();
    let mut rng = Rng::fresh("host_cache");
    let reuses_before = metrics::value(Metric::HostCacheReuses);
    for _ in 0..3 {
        // Fresh values each round: a reused block must not leak old ones.
        let x = rng.f32s(ELEMENTS);
        let input = client
            .buffer_from_host(&f32_bytes(&x), DType::F32, &[ELEMENTS as i64], &device)
            .unwrap();
        let out = exe
            .execute(&[&[&input]], &ExecuteOptions::default())
            .unwrap();
        let want: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
        assert_close(&f32s_from(&out[0][0].to_host().unwrap()), &want, 0.0, 0.0);
    }
    // The input and output blocks of one round serve the next rounds.
    assert!(metrics::value(Metric::HostCacheReuses) >= reuses_before + 2);
    // The plugin may free a buffer on one of its threads a little later.
    let deadline = Instant::now() + Duration::from_secs(3);
    while metrics::value(Metric::HostCacheBytes) < BLOCK_BYTES && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(metrics::value(Metric::HostCacheBytes) >= BLOCK_BYTES);

    let released = host_cache::release();
    assert!(released >= BLOCK_BYTES, "released {released} bytes");
    assert_eq!(metrics::value(Metric::HostCacheBytes), 0);
    assert_eq!(host_cache::release(), 0);
}
