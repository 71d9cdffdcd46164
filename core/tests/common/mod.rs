//! Shared helpers for the runtime tests: the real plugins, random data, and
//! a macro that stamps each test once per plugin.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::sync::OnceLock;

use rtpu_core::engine::TensorArg;
use rtpu_core::runtime::{self, Client, CreateOption};
use rtpu_core::storage::{Storage, View};
use rtpu_core::DType;

/// Devices the CPU client is created with, so collective and SPMD tests have
/// several devices.
pub const CPU_DEVICES: i64 = 4;

/// `$RTPU_PLUGIN`, else the CPU plugin in the repository's `.venv`.
pub fn cpu_plugin_path() -> PathBuf {
    if let Some(path) = std::env::var_os(runtime::PLUGIN_ENV) {
        return PathBuf::from(path);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = root.join(".venv/lib");
    let python = std::fs::read_dir(&lib)
        .ok()
        .and_then(|mut dirs| {
            dirs.find_map(|d| {
                d.ok()
                    .filter(|d| d.file_name().to_string_lossy().starts_with("python"))
            })
        })
        .map(|d| d.path())
        .unwrap_or_else(|| {
            panic!(
                "no {} and no Python in {}; {}",
                runtime::PLUGIN_ENV,
                lib.display(),
                runtime::PLUGIN_INSTALL_HINT
            )
        });
    python.join("site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

pub fn cpu_client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let plugin = runtime::load(&cpu_plugin_path()).expect("load the CPU plugin");
        Client::create(
            plugin,
            &[("cpu_device_count", CreateOption::Int(CPU_DEVICES))],
        )
        .expect("create a CPU client")
    })
}

/// The GPU client of `RTPU_TEST_GPU_PLUGIN` (e.g. jax-cuda13-pjrt's). Only the
/// GPU twins call it, and they are compiled to run only when that variable
/// was set at build time (see `build.rs`), so a plugin that is named but
/// missing fails them rather than skipping them.
pub fn gpu_client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let path = std::env::var_os("RTPU_TEST_GPU_PLUGIN")
            .expect("RTPU_TEST_GPU_PLUGIN was set when the tests were built but is not set now");
        let plugin = runtime::load(path.as_ref()).expect("load the GPU plugin");
        Client::create(plugin, &[]).expect("create a GPU client")
    })
}

/// Checks a client has the devices a test needs, naming the shortfall.
pub fn require_devices(client: &Client, needed: usize) {
    assert!(
        client.device_count() >= needed,
        "this test needs {needed} devices; the {} client has {}",
        client.platform_name().unwrap_or_default(),
        client.device_count()
    );
}

/// Stamps every listed `fn(&Client)` as a test on each plugin: always the CPU
/// plugin; the GPU one when `RTPU_TEST_GPU_PLUGIN` named it at build time,
/// and otherwise the GPU twin is listed as ignored with that reason. Tests
/// after `four_devices:` need four devices: the CPU client always has them,
/// and their GPU twins run only when `RTPU_TEST_GPU_DEVICES` is at least 4.
#[macro_export]
macro_rules! device_tests {
    ($($name:ident),* $(,)? ; four_devices: $($multi:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $name() { super::$name(super::common::cpu_client()) } )*
            $( #[test] fn $multi() { super::$multi(super::common::cpu_client()) } )*
        }
        mod gpu {
            $(
                #[test]
                #[cfg_attr(not(rtpu_test_gpu), ignore = "RTPU_TEST_GPU_PLUGIN was not set at build time")]
                fn $name() { super::$name(super::common::gpu_client()) }
            )*
            $(
                #[test]
                #[cfg_attr(
                    not(rtpu_test_gpu_4),
                    ignore = "needs a GPU plugin with 4 devices (RTPU_TEST_GPU_PLUGIN, RTPU_TEST_GPU_DEVICES=4)"
                )]
                fn $multi() { super::$multi(super::common::gpu_client()) }
            )*
        }
    };
}

/// A small deterministic generator, freshly seeded per test run (the seed is
/// printed so a failure can be replayed with `RTPU_TEST_SEED`).
pub struct Rng(u64);

impl Rng {
    pub fn fresh(test: &str) -> Rng {
        let seed = match std::env::var("RTPU_TEST_SEED") {
            Ok(s) => s.parse().expect("RTPU_TEST_SEED is a u64"),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        };
        eprintln!("{test}: RTPU_TEST_SEED={seed}");
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// A contiguous float32 tensor of `sizes` on device 0 of the CPU client.
pub fn f32_tensor(values: &[f32], sizes: &[i64]) -> TensorArg {
    let storage = Storage::new(cpu_client(), 0, values.len() * 4).unwrap();
    storage
        .write_host_bytes(&f32_bytes(values), DType::F32)
        .unwrap();
    TensorArg {
        storage,
        view: View::contiguous(sizes, DType::F32),
    }
}

pub fn f32s_from(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Asserts `got` equals `want` within `rtol * |want| + atol` elementwise.
pub fn assert_close(got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "element {i}: got {g}, want {w} (rtol {rtol}, atol {atol})"
        );
    }
}

/// Row-major `a[m,k] @ b[k,n]` on the host, accumulated in f64.
pub fn host_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum::<f64>() as f32;
        }
    }
    out
}
