//! `rtpu_executable_compile` on fuzzed StableHLO text. A program that
//! compiles is run when its `@main` takes and returns static tensors of
//! modest size and it cannot block or loop (no while, infeed, send/recv,
//! custom calls): inputs are made from its signature and outputs read back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtpu::buffer::{
    rtpu_buffer, rtpu_buffer_destroy, rtpu_buffer_from_host, rtpu_buffer_from_host_args,
    rtpu_buffer_host_size, rtpu_buffer_to_host, RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE,
};
use rtpu::executable::{
    rtpu_executable_destroy, rtpu_executable_execute, rtpu_executable_num_devices,
    rtpu_executable_num_outputs, rtpu_execute_args, RTPU_EXECUTE_ARGS_STRUCT_SIZE,
};
use rtpu_fuzz::tensors::{dtype_size, MAX_READ_BYTES};
use rtpu_fuzz::{compile, runtime, take, verbose};

/// Inputs and outputs past this many elements are not run.
const MAX_ELEMENTS: u64 = 1 << 16;

/// Ops that may block or run for ever on the CPU plugin.
const NOT_RUN: [&str; 6] = ["while", "infeed", "outfeed", "send", "recv", "custom_call"];

fuzz_target!(|data: &[u8]| {
    let (outcome, exe) = compile(data);
    if verbose() {
        eprintln!("compile: {outcome:?}");
    }
    if !outcome.is_ok() {
        assert!(exe.is_null(), "executable written on failure");
        return;
    }
    let text = String::from_utf8_lossy(data);
    if rtpu_executable_num_devices(exe) == 1 && !NOT_RUN.iter().any(|op| text.contains(op)) {
        if let Some((params, results)) = signature(&text) {
            if params
                .iter()
                .chain(&results)
                .all(|t| t.elements() <= MAX_ELEMENTS)
            {
                run(exe, &params);
            }
        }
    }
    rtpu_executable_destroy(exe);
});

/// A tensor type of the signature: `RTPU_DTYPE_*` and static dims.
struct TensorType {
    dtype: u32,
    dims: Vec<i64>,
}

impl TensorType {
    fn elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
            .unwrap_or(u64::MAX)
    }
}

/// `@main`'s parameter and result types, when all are static tensors.
fn signature(text: &str) -> Option<(Vec<TensorType>, Vec<TensorType>)> {
    let start = text.find("@main(")? + "@main(".len();
    let rest = &text[start..];
    let mut depth = 0usize;
    let close = rest.char_indices().find_map(|(i, c)| match c {
        '(' | '<' => {
            depth += 1;
            None
        }
        '>' => {
            depth = depth.saturating_sub(1);
            None
        }
        ')' if depth == 0 => Some(i),
        ')' => {
            depth -= 1;
            None
        }
        _ => None,
    })?;
    let params = tensor_types(&rest[..close])?;
    let after = &rest[close..];
    let body = after.find('{')?;
    let results = tensor_types(after[..body].split_once("->")?.1)?;
    Some((params, results))
}

fn tensor_types(text: &str) -> Option<Vec<TensorType>> {
    text.split("tensor<")
        .skip(1)
        .map(|t| {
            let spec = &t[..t.find('>')?];
            let spec = spec.split(',').next()?.trim();
            let mut parts: Vec<&str> = spec.split('x').collect();
            let element = parts.pop()?;
            let dims = parts
                .iter()
                .map(|d| d.trim().parse().ok())
                .collect::<Option<Vec<i64>>>()?;
            let dtype = match element {
                "i1" => 1,
                "i8" => 2,
                "i16" => 3,
                "i32" => 4,
                "i64" => 5,
                "ui8" => 6,
                "ui16" => 7,
                "ui32" => 8,
                "ui64" => 9,
                "f16" => 10,
                "bf16" => 11,
                "f32" => 12,
                "f64" => 13,
                _ => return None,
            };
            Some(TensorType { dtype, dims })
        })
        .collect()
}

/// Runs `exe` on inputs of `params` (ones of each dtype) and reads the
/// outputs back.
fn run(exe: *const rtpu::executable::rtpu_executable, params: &[TensorType]) {
    let mut inputs: Vec<*mut rtpu_buffer> = Vec::new();
    for p in params {
        let size = dtype_size(p.dtype).unwrap_or(1);
        let data = vec![1u8; p.elements() as usize * size];
        let args = rtpu_buffer_from_host_args {
            struct_size: RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE,
            data: data.as_ptr().cast(),
            data_size: data.len(),
            dtype: p.dtype,
            dims: p.dims.as_ptr(),
            num_dims: p.dims.len(),
            device_index: 0,
        };
        let mut buffer = std::ptr::null_mut();
        if take(rtpu_buffer_from_host(runtime(), &args, &mut buffer)).is_ok() {
            inputs.push(buffer);
        }
    }
    let num_outputs = rtpu_executable_num_outputs(exe);
    let mut outputs = vec![std::ptr::null_mut::<rtpu_buffer>(); num_outputs];
    let handles: Vec<*const rtpu_buffer> = inputs.iter().map(|&b| b.cast_const()).collect();
    let args = rtpu_execute_args {
        struct_size: RTPU_EXECUTE_ARGS_STRUCT_SIZE,
        arguments: handles.as_ptr(),
        num_args: handles.len(),
        donated: std::ptr::null(),
        num_donated: 0,
    };
    let outcome = take(rtpu_executable_execute(
        exe,
        &args,
        outputs.as_mut_ptr(),
        outputs.len(),
    ));
    if verbose() {
        eprintln!("execute: {outcome:?}");
    }
    if outcome.is_ok() {
        for &out in &outputs {
            assert!(!out.is_null(), "execute succeeded without an output");
            let mut size = 0usize;
            if take(rtpu_buffer_host_size(out, &mut size)).is_ok() && size as u128 <= MAX_READ_BYTES
            {
                let mut host = vec![0u8; size];
                take(rtpu_buffer_to_host(out, host.as_mut_ptr().cast(), size));
            }
            rtpu_buffer_destroy(out);
        }
    }
    for buffer in inputs {
        rtpu_buffer_destroy(buffer);
    }
}
