//! The PJRT runtime against real plugins: numbers, collectives, SPMD,
//! serialisation, donation, dtypes, and errors from bad programs and arguments.

mod common;

use common::{assert_close, f32_bytes, f32s_from, host_matmul, Rng};
use rtpu_core::runtime::{
    self, Buffer, Client, CompileOptions, Device, ExecuteOptions, LoadedExecutable,
};
use rtpu_core::{DType, ErrorCode};

/// fp32 tolerances: XLA's tanh and dot may differ from f64 host math by a few ulps.
const F32_RTOL: f32 = 1e-5;
const F32_ATOL: f32 = 1e-6;

const MATMUL_TANH: &str = r#"
module @matmul_tanh {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> tensor<2x2xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.tanh %0 : tensor<2x2xf32>
    return %1 : tensor<2x2xf32>
  }
}
"#;

fn upload(client: &Client, values: &[f32], dims: &[i64], device: &Device) -> Buffer {
    client
        .buffer_from_host(&f32_bytes(values), DType::F32, dims, device)
        .unwrap()
}

fn download(buffer: &Buffer) -> Vec<f32> {
    f32s_from(&buffer.to_host().unwrap())
}

/// `MATMUL_TANH` compiled, with fresh random inputs `a` (2x3) and `b` (3x2)
/// on device 0.
struct MatmulTanh {
    exe: LoadedExecutable,
    a: Vec<f32>,
    b: Vec<f32>,
    da: Buffer,
    db: Buffer,
}

fn compile_matmul_tanh(client: &Client, seed: &str) -> MatmulTanh {
    let mut rng = Rng::fresh(seed);
    let (a, b) = (rng.f32s(6), rng.f32s(6));
    let device = client.device(0).unwrap();
    let exe = client
        .compile(MATMUL_TANH, &CompileOptions::default())
        .unwrap();
    let (da, db) = (
        upload(client, &a, &[2, 3], &device),
        upload(client, &b, &[3, 2], &device),
    );
    MatmulTanh { exe, a, b, da, db }
}

/// Options that donate argument `index`.
fn donating(index: usize) -> ExecuteOptions {
    ExecuteOptions {
        donate: vec![index],
        ..Default::default()
    }
}

fn matmul_tanh(client: &Client) {
    let MatmulTanh { exe, a, b, da, db } = compile_matmul_tanh(client, "matmul_tanh");
    let out = exe
        .execute(&[&[&da, &db]], &ExecuteOptions::default())
        .unwrap();
    let want: Vec<f32> = host_matmul(&a, &b, 2, 3, 2)
        .iter()
        .map(|x| x.tanh())
        .collect();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len(), 1);
    assert_eq!(out[0][0].dims().unwrap(), vec![2, 2]);
    assert_eq!(out[0][0].dtype().unwrap(), DType::F32);
    assert_close(&download(&out[0][0]), &want, F32_RTOL, F32_ATOL);

    // Enqueued without waiting: reading the output waits for the data.
    let options = ExecuteOptions {
        asynchronous: true,
        ..Default::default()
    };
    let out = exe.execute(&[&[&da, &db]], &options).unwrap();
    assert_close(&download(&out[0][0]), &want, F32_RTOL, F32_ATOL);
}

fn multi_output(client: &Client) {
    let program = r#"
module @sum_and_product {
  func.func public @main(%a: tensor<5xf32>, %b: tensor<5xf32>) -> (tensor<5xf32>, tensor<5xf32>, tensor<f32>) {
    %sum = stablehlo.add %a, %b : tensor<5xf32>
    %prod = stablehlo.multiply %a, %b : tensor<5xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %total = stablehlo.reduce(%prod init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<5xf32>, tensor<f32>) -> tensor<f32>
    return %sum, %prod, %total : tensor<5xf32>, tensor<5xf32>, tensor<f32>
  }
}
"#;
    let mut rng = Rng::fresh("multi_output");
    let (a, b) = (rng.f32s(5), rng.f32s(5));
    let device = client.device(0).unwrap();
    let exe = client.compile(program, &CompileOptions::default()).unwrap();
    assert_eq!(exe.num_outputs(), 3);
    let (da, db) = (
        upload(client, &a, &[5], &device),
        upload(client, &b, &[5], &device),
    );
    let out = exe
        .execute(&[&[&da, &db]], &ExecuteOptions::default())
        .unwrap();
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let prod: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    let total: f32 = prod.iter().sum();
    assert_close(&download(&out[0][0]), &sum, 0.0, 0.0);
    assert_close(&download(&out[0][1]), &prod, 0.0, 0.0);
    // The outputs' shapes come from the optimised program's signature.
    assert_eq!(out[0][0].dims().unwrap(), vec![5]);
    assert_eq!(out[0][1].dims().unwrap(), vec![5]);
    assert_eq!(out[0][2].dims().unwrap(), Vec::<i64>::new());
    assert_eq!(out[0][2].dtype().unwrap(), DType::F32);
    assert_close(&download(&out[0][2]), &[total], F32_RTOL, F32_ATOL);
}

fn all_reduce_across_four_devices(client: &Client) {
    common::require_devices(client, 4);
    let program = r#"
module @all_reduce attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%l: tensor<f32>, %r: tensor<f32>):
        %s = stablehlo.add %l, %r : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"#;
    let mut rng = Rng::fresh("all_reduce");
    let options = CompileOptions {
        num_replicas: 4,
        ..Default::default()
    };
    let exe = client.compile(program, &options).unwrap();
    assert_eq!(exe.devices().len(), 4);
    let inputs: Vec<Vec<f32>> = (0..4).map(|_| rng.f32s(3)).collect();
    let buffers: Vec<Buffer> = exe
        .devices()
        .iter()
        .zip(&inputs)
        .map(|(device, values)| upload(client, values, &[3], device))
        .collect();
    let rows: Vec<[&Buffer; 1]> = buffers.iter().map(|b| [b]).collect();
    let args: Vec<&[&Buffer]> = rows.iter().map(|r| &r[..]).collect();
    let out = exe.execute(&args, &ExecuteOptions::default()).unwrap();
    let want: Vec<f32> = (0..3).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
    assert_eq!(out.len(), 4);
    for device_out in &out {
        assert_close(&download(&device_out[0]), &want, F32_RTOL, F32_ATOL);
    }
}

fn spmd_partitioned_matches_unpartitioned(client: &Client) {
    common::require_devices(client, 4);
    // Rows of `a` are split over 4 partitions; `b` is replicated.
    let body = r#"
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
    %1 = stablehlo.tanh %0 : tensor<8x4xf32>
    return %1 : tensor<8x4xf32>
  }
}
"#;
    let plain = format!(
        "module @plain {{\n  func.func public @main(%a: tensor<8x4xf32>, %b: tensor<4x4xf32>) -> tensor<8x4xf32> {{{body}"
    );
    let spmd = format!(
        "module @spmd attributes {{mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32}} {{\n  \
         func.func public @main(%a: tensor<8x4xf32> {{mhlo.sharding = \"{{devices=[4,1]<=[4]}}\"}}, \
         %b: tensor<4x4xf32> {{mhlo.sharding = \"{{replicated}}\"}}) \
         -> (tensor<8x4xf32> {{mhlo.sharding = \"{{devices=[4,1]<=[4]}}\"}}) {{{body}"
    );
    let mut rng = Rng::fresh("spmd");
    let (a, b) = (rng.f32s(32), rng.f32s(16));

    let device = client.device(0).unwrap();
    let exe = client.compile(&plain, &CompileOptions::default()).unwrap();
    let (da, db) = (
        upload(client, &a, &[8, 4], &device),
        upload(client, &b, &[4, 4], &device),
    );
    let want = download(
        &exe.execute(&[&[&da, &db]], &ExecuteOptions::default())
            .unwrap()[0][0],
    );

    let options = CompileOptions {
        num_partitions: 4,
        use_spmd_partitioning: true,
        ..Default::default()
    };
    let exe = client.compile(&spmd, &options).unwrap();
    assert_eq!(exe.devices().len(), 4);
    let shards: Vec<(Buffer, Buffer)> = exe
        .devices()
        .iter()
        .enumerate()
        .map(|(p, device)| {
            let rows = &a[p * 8..(p + 1) * 8]; // 2 rows x 4 columns per partition
            (
                upload(client, rows, &[2, 4], device),
                upload(client, &b, &[4, 4], device),
            )
        })
        .collect();
    let rows: Vec<[&Buffer; 2]> = shards.iter().map(|(x, y)| [x, y]).collect();
    let args: Vec<&[&Buffer]> = rows.iter().map(|r| &r[..]).collect();
    let out = exe.execute(&args, &ExecuteOptions::default()).unwrap();
    let got: Vec<f32> = out
        .iter()
        .flat_map(|device_out| download(&device_out[0]))
        .collect();
    assert_close(&got, &want, F32_RTOL, F32_ATOL);
}

fn serialize_round_trip(client: &Client) {
    let MatmulTanh { exe, da, db, .. } = compile_matmul_tanh(client, "serialize");
    let want = download(
        &exe.execute(&[&[&da, &db]], &ExecuteOptions::default())
            .unwrap()[0][0],
    );

    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    drop(exe);
    let loaded = client.deserialize(&bytes).unwrap();
    let got = download(
        &loaded
            .execute(&[&[&da, &db]], &ExecuteOptions::default())
            .unwrap()[0][0],
    );
    assert_eq!(got, want);

    let err = client.deserialize(b"not an executable").unwrap_err();
    assert!(!err.to_string().is_empty());
}

fn invalid_stablehlo_carries_xla_message(client: &Client) {
    let program = r#"
module @bad {
  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
    %0 = stablehlo.no_such_op %a : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
"#;
    let err = client
        .compile(program, &CompileOptions::default())
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("PJRT_Client_Compile"), "{message}");
    assert!(
        message.contains("no_such_op"),
        "XLA's parse error should name the op: {message}"
    );
}

fn wrong_arguments_are_errors(client: &Client) {
    let device = client.device(0).unwrap();
    let exe = client
        .compile(MATMUL_TANH, &CompileOptions::default())
        .unwrap();
    let parameters = exe
        .parameters()
        .expect("the plugin reports parameter types");
    assert_eq!(parameters.len(), 2);
    assert_eq!(
        (parameters[0].dtype, parameters[0].dims.as_slice()),
        (DType::F32, &[2i64, 3][..])
    );
    let good_a = upload(client, &[0.5; 6], &[2, 3], &device);
    let good_b = upload(client, &[0.5; 6], &[3, 2], &device);
    let none = ExecuteOptions::default();

    let too_few = exe.execute(&[&[&good_a]], &none).unwrap_err();
    assert_eq!(too_few.code(), ErrorCode::InvalidArgument, "{too_few}");

    let too_many = exe
        .execute(&[&[&good_a, &good_b, &good_b]], &none)
        .unwrap_err();
    assert_eq!(too_many.code(), ErrorCode::InvalidArgument, "{too_many}");

    let wrong_shape = upload(client, &[0.5; 6], &[3, 2], &device);
    let err = exe.execute(&[&[&wrong_shape, &good_b]], &none).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");

    let wrong_dtype = client
        .buffer_from_host(&[0u8; 6 * 8], DType::F64, &[2, 3], &device)
        .unwrap();
    let err = exe.execute(&[&[&wrong_dtype, &good_b]], &none).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");

    let err = exe.execute(&[], &none).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");

    // The executable still works after all of that.
    let out = exe.execute(&[&[&good_a, &good_b]], &none).unwrap();
    let want = (0.75f32).tanh();
    assert_close(&download(&out[0][0]), &[want; 4], F32_RTOL, F32_ATOL);
}

fn every_dtype_round_trips(client: &Client) {
    let mut rng = Rng::fresh("dtypes");
    let devices = client.devices();
    for dtype in DType::ALL {
        let dims = [3i64, 5];
        let mut bytes = rng.bytes(15 * dtype.size_in_bytes());
        if dtype == DType::Bool {
            bytes.iter_mut().for_each(|b| *b &= 1);
        }
        let buffer = client
            .buffer_from_host(&bytes, dtype, &dims, &devices[0])
            .unwrap();
        assert_eq!(buffer.dtype().unwrap(), dtype);
        assert_eq!(buffer.dims().unwrap(), dims);
        assert!(buffer.on_device_size().unwrap() >= bytes.len(), "{dtype}");
        assert_eq!(buffer.to_host().unwrap(), bytes, "{dtype} host round trip");
        // The CPU plugin lays every dtype out densely: a run of elements
        // is a run of raw bytes.
        assert!(buffer.is_dense_row_major().unwrap(), "{dtype}");
        let size = dtype.size_in_bytes();
        let mut part = vec![0u8; 7 * size];
        buffer.copy_raw_to_host(4 * size, &mut part).unwrap();
        assert_eq!(part, bytes[4 * size..11 * size], "{dtype} raw read");

        let other = devices.last().unwrap();
        let copy = buffer.copy_to_device(other).unwrap();
        assert_eq!(copy.device().unwrap().id().unwrap(), other.id().unwrap());
        assert_eq!(
            copy.to_host().unwrap(),
            bytes,
            "{dtype} device-to-device copy"
        );
    }
}

fn host_data_of_the_wrong_size_is_rejected(client: &Client) {
    let device = client.device(0).unwrap();
    let err = client
        .buffer_from_host(&[0u8; 7], DType::F32, &[2], &device)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = client
        .buffer_from_host(&[], DType::F32, &[-1], &device)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let buffer = upload(client, &[1.0, 2.0], &[2], &device);
    let mut small = [0u8; 4];
    assert_eq!(
        buffer.copy_to_host(&mut small).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
}

fn donation_consumes_only_donated_inputs(client: &Client) {
    let program = r#"
module @add_one {
  func.func public @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %x, %one : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;
    let device = client.device(0).unwrap();
    let exe = client.compile(program, &CompileOptions::default()).unwrap();
    let kept = upload(client, &[1.0, 2.0, 3.0, 4.0], &[4], &device);
    let out = exe
        .execute(&[&[&kept]], &ExecuteOptions::default())
        .unwrap();
    assert!(!kept.is_deleted().unwrap());
    assert_eq!(download(&out[0][0]), vec![2.0, 3.0, 4.0, 5.0]);
    assert_eq!(download(&kept), vec![1.0, 2.0, 3.0, 4.0]);

    let donated = upload(client, &[1.0, 2.0, 3.0, 4.0], &[4], &device);
    let out = exe.execute(&[&[&donated]], &donating(0)).unwrap();
    assert!(donated.is_deleted().unwrap());
    assert_eq!(download(&out[0][0]), vec![2.0, 3.0, 4.0, 5.0]);
    // Reading a donated buffer is an error, not a crash.
    assert!(donated.to_host().is_err());

    let err = exe.execute(&[&[&kept]], &donating(1)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

fn client_and_devices_describe_themselves(client: &Client) {
    assert!(!client.platform_name().unwrap().is_empty());
    assert!(!client.platform_version().unwrap().is_empty());
    let devices = client.devices();
    assert_eq!(devices.len(), client.device_count());
    let mut ids: Vec<i32> = devices.iter().map(|d| d.id().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), devices.len(), "device ids are distinct");
    for device in &devices {
        assert!(!device.kind().unwrap().is_empty());
        assert!(!device.description_string().unwrap().is_empty());
        // Plugins without memory statistics report None rather than failing.
        if let Some(stats) = device.memory_stats().unwrap() {
            assert!(stats.bytes_in_use >= 0);
        }
    }
    let err = client.device(devices.len()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

device_tests!(
    matmul_tanh,
    multi_output,
    serialize_round_trip,
    invalid_stablehlo_carries_xla_message,
    wrong_arguments_are_errors,
    every_dtype_round_trips,
    host_data_of_the_wrong_size_is_rejected,
    donation_consumes_only_donated_inputs,
    client_and_devices_describe_themselves;
    four_devices: all_reduce_across_four_devices, spmd_partitioned_matches_unpartitioned,
);

#[test]
fn cpu_client_has_the_requested_devices() {
    let client = common::cpu_client();
    assert_eq!(client.platform_name().unwrap(), "cpu");
    assert_eq!(client.device_count(), common::CPU_DEVICES as usize);
}

#[test]
fn a_plugin_is_loaded_once_per_path() {
    let path = common::cpu_plugin_path();
    let first = runtime::load(&path).unwrap();
    let second = runtime::load(&path).unwrap();
    assert!(std::ptr::eq(first, second));
    assert_eq!(first.api_version().0, runtime::RTPU_PJRT_API_VERSION.0);
}

#[test]
fn a_missing_plugin_explains_how_to_install_one() {
    let err = runtime::load("/nonexistent/xla_cpu_pjrt.so".as_ref()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("xla-cpu-pjrt"), "{err}");
}
