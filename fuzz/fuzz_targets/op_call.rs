//! `rtpu_op_call` on the real CPU plugin: an op picked by index, with
//! arguments drawn by its ATen schema (`rtpu_fuzz::op_args`), then every
//! output read back to the host and everything released.
//!
//! Beyond "no crash" it checks what the ABI promises: no PANIC error, a
//! message on every error, outputs that alias a tensor argument or are
//! well-formed new views, and a refused call leaving the storages it would
//! have written as they were. Every 1000 calls it prints how many got past
//! the argument checks.

#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use rtpu::ops::{
    rtpu_op_arg, rtpu_op_call, rtpu_op_count, rtpu_op_name, rtpu_op_output, rtpu_op_result_count,
    rtpu_op_result_destroy, rtpu_op_result_get, RTPU_ARG_TENSOR,
};
use rtpu::storage::{rtpu_storage_release, rtpu_tensor_ref};
use rtpu_fuzz::op_args::{draw_args, Draw};
use rtpu_fuzz::schema::{schemas, OpSchema};
use rtpu_fuzz::tensors::{copy_ref, read, storage_bytes, Arena};
use rtpu_fuzz::{c_string, runtime, take, verbose, Outcome};

/// rtpu's ops by index, with their schemas (`None`: no schema known, so
/// the op is skipped, and counted at start).
fn ops() -> &'static [(String, Option<&'static OpSchema>)] {
    static OPS: OnceLock<Vec<(String, Option<&'static OpSchema>)>> = OnceLock::new();
    OPS.get_or_init(|| {
        let ops: Vec<_> = (0..rtpu_op_count())
            .map(|i| {
                // SAFETY: op names are static strings.
                let name = unsafe { c_string(rtpu_op_name(i)) };
                let schema = schemas().get(&name);
                (name, schema)
            })
            .collect();
        let missing = ops.iter().filter(|(_, s)| s.is_none()).count();
        eprintln!(
            "op_call: {} ops, {missing} without a schema in fuzz/op_schemas.txt \
             (rerun fuzz/gen_op_schemas.py)",
            ops.len()
        );
        ops
    })
}

/// Call outcomes since the process started.
#[derive(Default)]
struct Stats {
    calls: AtomicU64,
    /// Past the argument checks: the op ran.
    ok: AtomicU64,
    invalid: AtomicU64,
    other: AtomicU64,
    /// Reads of outputs that failed (a failure while running surfaces there).
    read_errors: AtomicU64,
    /// Which ops have run at least once.
    reached: Mutex<Vec<bool>>,
}

fn stats() -> &'static Stats {
    static STATS: OnceLock<Stats> = OnceLock::new();
    STATS.get_or_init(Stats::default)
}

impl Stats {
    fn record(&self, op: usize, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Ok => {
                let mut reached = self.reached.lock().unwrap_or_else(|p| p.into_inner());
                reached.resize(ops().len(), false);
                reached[op] = true;
                &self.ok
            }
            o if o.is_invalid() => &self.invalid,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let calls = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if calls.is_multiple_of(1000) {
            self.print(calls);
        }
    }

    fn print(&self, calls: u64) {
        let pct = |c: &AtomicU64| 100.0 * c.load(Ordering::Relaxed) as f64 / calls as f64;
        let reached = self.reached.lock().unwrap_or_else(|p| p.into_inner());
        eprintln!(
            "op_call stats: {calls} calls, {:.1}% past argument checks, {:.1}% INVALID_ARGUMENT, \
             {:.1}% other errors, {} failed reads, {}/{} ops reached",
            pct(&self.ok),
            pct(&self.invalid),
            pct(&self.other),
            self.read_errors.load(Ordering::Relaxed),
            reached.iter().filter(|&&r| r).count(),
            ops().len(),
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = runtime();
    let ops = ops();
    let mut u = Unstructured::new(data);
    let mut d = Draw::new(&mut u);
    let index = d.below(ops.len());
    let (name, Some(schema)) = &ops[index] else {
        return;
    };
    let mut arena = Arena::default();
    let args = draw_args(&mut d, &mut arena, schema);
    // What the op may write, to check a refused call left it alone.
    let written: Vec<(&rtpu_tensor_ref, Vec<u8>)> = args
        .iter()
        .zip(&schema.params)
        .filter(|(a, p)| p.writes && a.tag == RTPU_ARG_TENSOR && !a.tensor.storage.is_null())
        .filter_map(|(a, _)| {
            let t = &a.tensor;
            Some((t, storage_bytes(&mut arena, t.storage, t.dtype)?))
        })
        .collect();

    if verbose() {
        eprintln!("calling {name} with {}", describe(&args));
    }
    let mut result = std::ptr::null_mut();
    let outcome = take(rtpu_op_call(
        rt,
        index,
        args.as_ptr(),
        args.len(),
        &mut result,
    ));
    if verbose() {
        eprintln!("{name} ({} args): {outcome:?}", args.len());
    }
    stats().record(index, &outcome);
    if !outcome.is_ok() {
        assert!(result.is_null(), "{name}: result written on failure");
        for (t, before) in &written {
            let after = storage_bytes(&mut arena, t.storage, t.dtype);
            assert!(
                after.as_ref() == Some(before),
                "{name}: the refused call ({outcome:?}) changed a storage it writes"
            );
        }
        return;
    }
    for i in 0..rtpu_op_result_count(result) {
        read_output(name, &args, result, i);
    }
    rtpu_op_result_destroy(result);
});

/// Reads output `i` back (a new tensor, or the argument it aliases) and
/// releases what it handed out.
fn read_output(
    name: &str,
    args: &[rtpu_op_arg],
    result: *const rtpu::ops::rtpu_op_result,
    i: usize,
) {
    let mut out = rtpu_op_output::default();
    let got = take(rtpu_op_result_get(result, i, &mut out));
    assert!(got.is_ok(), "{name}: output {i}: {got:?}");
    let view = if out.alias_of >= 0 {
        let arg = args.get(out.alias_of as usize);
        assert!(
            arg.is_some_and(|a| a.tag == RTPU_ARG_TENSOR),
            "{name}: output {i} aliases argument {}, not a tensor argument",
            out.alias_of
        );
        arg.map(|a| copy_ref(&a.tensor))
    } else if out.storage.is_null() {
        None
    } else {
        Some(rtpu_tensor_ref {
            storage: out.storage,
            storage_offset: out.storage_offset,
            sizes: out.sizes,
            strides: out.strides,
            ndim: out.ndim,
            dtype: out.dtype,
        })
    };
    if let Some(view) = view {
        if let Some((outcome, _)) = read(&view) {
            if !outcome.is_ok() {
                stats().read_errors.fetch_add(1, Ordering::Relaxed);
                if verbose() {
                    eprintln!("{name}: reading output {i}: {outcome:?}");
                }
            }
        }
    }
    if !out.storage.is_null() {
        rtpu_storage_release(out.storage);
    }
}

/// The arguments, briefly: tags, values and tensor shapes (for replays).
fn describe(args: &[rtpu_op_arg]) -> String {
    let ints = |p: *const i64, n: usize| -> Vec<i64> {
        if p.is_null() || n == 0 {
            return Vec::new();
        }
        // SAFETY: our own arrays of `n` elements, alive for the call.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    };
    args.iter()
        .map(|a| match a.tag {
            RTPU_ARG_TENSOR => format!(
                "tensor(dtype {}, sizes {:?}, strides {:?}, offset {})",
                a.tensor.dtype,
                ints(a.tensor.sizes, a.tensor.ndim),
                ints(a.tensor.strides, a.tensor.ndim),
                a.tensor.storage_offset
            ),
            2 => format!("int {}", a.int_value),
            3 => format!("double {}", a.double_value),
            4 => format!("bool {}", a.bool_value),
            5 => format!("ints {:?}", ints(a.int_list, a.list_size)),
            7 => format!("tensor list of {}", a.list_size),
            tag => format!("tag {tag}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
