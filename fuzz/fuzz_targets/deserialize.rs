//! `rtpu_executable_deserialize` on fuzzed bytes: raw, or a valid
//! serialized executable (made at start) with bytes patched, inserted,
//! removed or cut off. A loaded executable is queried, serialized again and
//! destroyed, never run: XLA CPU executables hold native code, and running
//! corrupted code is undefined behaviour, not a finding.

#![no_main]

use std::sync::OnceLock;

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use rtpu::executable::{
    rtpu_bytes_data, rtpu_bytes_destroy, rtpu_bytes_size, rtpu_executable_deserialize,
    rtpu_executable_destroy, rtpu_executable_num_devices, rtpu_executable_num_outputs,
    rtpu_executable_serialize,
};
use rtpu_fuzz::{compile, runtime, take, verbose};

const ADD_ONE: &str = "module @add_one {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %x, %one : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
";

/// A valid serialized executable to mutate.
fn valid() -> &'static [u8] {
    static VALID: OnceLock<Vec<u8>> = OnceLock::new();
    VALID.get_or_init(|| {
        let (compiled, exe) = compile(ADD_ONE.as_bytes());
        assert!(compiled.is_ok(), "compiling the seed program: {compiled:?}");
        let bytes = serialize(exe).expect("serializing the seed program");
        rtpu_executable_destroy(exe);
        eprintln!(
            "deserialize: the valid executable has {} bytes",
            bytes.len()
        );
        bytes
    })
}

fn serialize(exe: *const rtpu::executable::rtpu_executable) -> Option<Vec<u8>> {
    let mut bytes = std::ptr::null_mut();
    if !take(rtpu_executable_serialize(exe, &mut bytes)).is_ok() {
        return None;
    }
    let size = rtpu_bytes_size(bytes);
    let data = rtpu_bytes_data(bytes);
    let copy = if size == 0 {
        Vec::new()
    } else {
        // SAFETY: `data` holds `size` bytes until `rtpu_bytes_destroy`.
        unsafe { std::slice::from_raw_parts(data, size) }.to_vec()
    };
    rtpu_bytes_destroy(bytes);
    Some(copy)
}

/// `valid` with edits drawn from `u`.
fn mutate(valid: &[u8], u: &mut Unstructured) -> Vec<u8> {
    let mut bytes = valid.to_vec();
    let edits = u.int_in_range(0..=16u8).unwrap_or(0);
    for _ in 0..edits {
        if bytes.is_empty() {
            break;
        }
        let at = u.int_in_range(0..=bytes.len() - 1).unwrap_or(0);
        match u.int_in_range(0..=4u8).unwrap_or(0) {
            0 => bytes[at] = u.arbitrary().unwrap_or(0),
            1 => bytes[at] ^= 1 << u.int_in_range(0..=7u8).unwrap_or(0),
            2 => bytes.insert(at, u.arbitrary().unwrap_or(0)),
            3 => {
                let end = (at + u.int_in_range(1..=64usize).unwrap_or(1)).min(bytes.len());
                bytes.drain(at..end);
            }
            _ => bytes.truncate(at),
        }
    }
    bytes
}

fuzz_target!(|data: &[u8]| {
    let rt = runtime();
    let bytes = match data.split_first() {
        Some((&mode, rest)) if mode % 2 == 0 => mutate(valid(), &mut Unstructured::new(rest)),
        Some((_, rest)) => rest.to_vec(),
        None => Vec::new(),
    };
    let mut exe = std::ptr::null_mut();
    let outcome = take(rtpu_executable_deserialize(
        rt,
        bytes.as_ptr().cast(),
        bytes.len(),
        &mut exe,
    ));
    if verbose() {
        eprintln!("{} bytes: {outcome:?}", bytes.len());
    }
    if !outcome.is_ok() {
        assert!(exe.is_null(), "executable written on failure");
        return;
    }
    rtpu_executable_num_devices(exe);
    rtpu_executable_num_outputs(exe);
    serialize(exe);
    rtpu_executable_destroy(exe);
});
