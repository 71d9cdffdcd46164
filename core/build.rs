//! Generates Rust bindings for the PJRT C API from the header that ships with
//! the PJRT plugin package (PyPI `xla-cpu-pjrt`), so the structs we pass match
//! the plugin's API version. Plugins reject args structs smaller than their own
//! (`PJRT_STRUCT_SIZE` checks), so an older vendored header does not work.

use std::env;
use std::path::{Path, PathBuf};

const HEADER_ENV: &str = "RTPU_PJRT_HEADER";
/// Names the GPU plugin the runtime tests also run on; without it their GPU
/// twins are ignored (with that reason), never passed without running.
const TEST_GPU_PLUGIN_ENV: &str = "RTPU_TEST_GPU_PLUGIN";
/// How many devices that GPU plugin has; tests needing four run on it only
/// when it has four.
const TEST_GPU_DEVICES_ENV: &str = "RTPU_TEST_GPU_DEVICES";

fn main() {
    println!("cargo:rerun-if-env-changed={HEADER_ENV}");
    test_gpu_cfgs();
    let header = find_header().unwrap_or_else(|searched| {
        panic!(
            "cannot find pjrt_c_api.h (looked in {searched}). Run the README's setup, which installs \
             PyPI `xla-cpu-pjrt` into .venv/, or set {HEADER_ENV} to the header of the plugin you use."
        )
    });
    println!("cargo:rerun-if-changed={}", header.display());
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_item("PJRT_.*")
        .derive_default(true)
        .generate_comments(false)
        .layout_tests(false)
        .generate()
        .expect("bindgen over pjrt_c_api.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("pjrt_bindings.rs");
    bindings.write_to_file(out).expect("write PJRT bindings");
}

/// `rtpu_test_gpu` when a GPU plugin is named for the tests, and
/// `rtpu_test_gpu_4` when it has four devices: libtest cannot skip at run
/// time, so whether a GPU twin runs is decided when it is compiled.
fn test_gpu_cfgs() {
    println!("cargo::rustc-check-cfg=cfg(rtpu_test_gpu, rtpu_test_gpu_4)");
    println!("cargo:rerun-if-env-changed={TEST_GPU_PLUGIN_ENV}");
    println!("cargo:rerun-if-env-changed={TEST_GPU_DEVICES_ENV}");
    if env::var_os(TEST_GPU_PLUGIN_ENV).is_some_and(|p| !p.is_empty()) {
        println!("cargo:rustc-cfg=rtpu_test_gpu");
        let devices = env::var(TEST_GPU_DEVICES_ENV).map_or(1, |n| {
            n.parse::<u32>()
                .unwrap_or_else(|_| panic!("{TEST_GPU_DEVICES_ENV}={n} is not a device count"))
        });
        if devices >= 4 {
            println!("cargo:rustc-cfg=rtpu_test_gpu_4");
        }
    }
}

/// `$RTPU_PJRT_HEADER`, else the header in the repository's `.venv`.
fn find_header() -> Result<PathBuf, String> {
    if let Some(path) = env::var_os(HEADER_ENV) {
        return Ok(PathBuf::from(path));
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let lib = manifest.join("../.venv/lib");
    let relative = Path::new("site-packages/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h");
    println!("cargo:rerun-if-changed={}", lib.display());
    let candidates = std::fs::read_dir(&lib)
        .map_err(|_| lib.join("python3.*").join(relative).display().to_string())?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join(relative));
    let mut found: Vec<PathBuf> = candidates.filter(|p| p.is_file()).collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| lib.join("python3.*").join(relative).display().to_string())
}
