//! Builds the C tests in `tests/c` and the C++ header check in `tests/cpp`
//! against librtpu.so with `-Wall -Wextra -Werror -pedantic`, ASan and UBSan,
//! and runs them on the real CPU plugin.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The directory holding the librtpu.so built with this test: cargo puts it
/// next to the test binary, in `target/<profile>/deps` (the copy one level up
/// is only refreshed by `cargo build`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("librtpu.so").is_file(),
        "librtpu.so is not in {}",
        dir.display()
    );
    dir
}

/// `$RTPU_PLUGIN`, else the CPU plugin in the repository's `.venv`.
fn plugin_path() -> PathBuf {
    if let Some(path) = std::env::var_os("RTPU_PLUGIN") {
        return PathBuf::from(path);
    }
    let lib = repo_root().join(".venv/lib");
    let python = std::fs::read_dir(&lib)
        .unwrap_or_else(|_| {
            panic!(
                "no RTPU_PLUGIN and no {}; run the README's setup",
                lib.display()
            )
        })
        .filter_map(Result::ok)
        .find(|d| d.file_name().to_string_lossy().starts_with("python"))
        .expect("a python directory in .venv/lib");
    python
        .path()
        .join("site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

fn out_dir() -> PathBuf {
    let dir = lib_dir().parent().unwrap().join("c-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const STRICT: &[&str] = &["-Wall", "-Wextra", "-Werror", "-pedantic"];
const SANITIZE: &[&str] = &[
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g",
];

fn compile(compiler: &str, std: &str, source: &str, output: &Path, extra: &[&str]) {
    let root = repo_root();
    let lib = lib_dir();
    let status = Command::new(compiler)
        .arg(std)
        .args(STRICT)
        .args(SANITIZE)
        .arg(format!("-I{}", root.join("include").display()))
        .arg(root.join(source))
        .arg("-o")
        .arg(output)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lrtpu")
        .args(extra)
        .status()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(status.success(), "compiling {source} failed");
}

/// Runs a sanitised test program with the CPU plugin. Leaks inside the
/// plugin's own process-lifetime state are suppressed; rtpu's are not.
fn run(program: &Path, args: &[&Path]) {
    let suppressions = out_dir().join("lsan.supp");
    std::fs::write(&suppressions, "leak:xla_cpu_pjrt.so\n").unwrap();
    let output = Command::new(program)
        .args(args)
        // cargo's LD_LIBRARY_PATH would win over the rpath and may hold a
        // stale librtpu.so one directory up.
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("RTPU_PLUGIN", plugin_path())
        // No disk cache: the tests count compiles, and stay hermetic.
        .env("RTPU_CACHE_DIR", "")
        .env("ASAN_OPTIONS", "detect_leaks=1")
        .env(
            "LSAN_OPTIONS",
            format!("suppressions={}", suppressions.display()),
        )
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        program.display(),
        output.status
    );
    assert!(stdout.contains(": ok"), "{stdout}");
}

/// Builds `tests/c/{name}.c` (with `extra` compiler arguments) and runs it.
fn c_test(name: &str, extra: &[&str]) {
    let exe = out_dir().join(name);
    compile("cc", "-std=c11", &format!("tests/c/{name}.c"), &exe, extra);
    run(&exe, &[]);
}

#[test]
fn happy_path() {
    c_test("happy_path", &["-lm"]);
}

#[test]
fn bad_input_gives_errors_not_crashes() {
    let dir = out_dir();
    let fake = dir.join("libfake_plugin_wrong_version.so");
    let status = Command::new("cc")
        .arg("-std=c11")
        .args(STRICT)
        .args(["-shared", "-fPIC"])
        .arg(repo_root().join("tests/c/fake_plugin_wrong_version.c"))
        .arg("-o")
        .arg(&fake)
        .status()
        .unwrap();
    assert!(status.success(), "compiling the fake plugin failed");
    // The refusal names both versions: the fake plugin's 99.7 and the one
    // rtpu was built against, which only the build knows.
    let (major, minor) = rtpu_core::runtime::RTPU_PJRT_API_VERSION;
    let built_against = format!("-DRTPU_TEST_BUILT_PJRT_API=\"{major}.{minor}\"");
    let exe = dir.join("bad_input");
    compile(
        "cc",
        "-std=c11",
        "tests/c/bad_input.c",
        &exe,
        &[&built_against],
    );
    run(&exe, &[&fake]);
}

#[test]
fn storages_views_and_op_calls() {
    c_test("ops", &[]);
}

#[test]
fn deferred_execution_and_captured_graphs() {
    c_test("deferred", &[]);
}

#[test]
fn collectives_from_four_threads() {
    c_test("collectives", &["-pthread"]);
}

#[test]
fn collectives_across_two_processes() {
    c_test("processes", &[]);
}

#[test]
fn storages_sharded_over_a_mesh() {
    c_test("sharding", &[]);
}

#[test]
fn events_mark_query_wait_and_time_device_work() {
    c_test("events", &[]);
}

#[test]
fn header_compiles_as_cpp17() {
    let exe = out_dir().join("header_compiles");
    compile(
        "c++",
        "-std=c++17",
        "tests/cpp/header_compiles.cpp",
        &exe,
        &[],
    );
    run(&exe, &[]);
}

#[test]
fn header_versions_match_cargo() {
    let header = std::fs::read_to_string(repo_root().join("include/rtpu.h")).unwrap();
    let define = |name: &str| -> u32 {
        let prefix = format!("#define {name} ");
        header
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{name} is not in include/rtpu.h"))
            .trim()
            .parse()
            .unwrap()
    };
    let cargo = |v: &str| v.parse::<u32>().unwrap();
    let (major, minor, patch) = (
        cargo(env!("CARGO_PKG_VERSION_MAJOR")),
        cargo(env!("CARGO_PKG_VERSION_MINOR")),
        cargo(env!("CARGO_PKG_VERSION_PATCH")),
    );
    assert_eq!(define("RTPU_VERSION_MAJOR"), major);
    assert_eq!(define("RTPU_VERSION_MINOR"), minor);
    assert_eq!(define("RTPU_VERSION_PATCH"), patch);
    assert_eq!(define("RTPU_VERSION"), major * 10000 + minor * 100 + patch);
    assert_eq!(define("RTPU_ABI_VERSION"), rtpu::RTPU_ABI_VERSION);
}
