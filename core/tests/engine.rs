//! The eager engine on the real CPU plugin: ops on strided views, in-place
//! writes through views, promotion, and errors.

mod common;

use common::{assert_close, f32_bytes, f32_tensor, f32s_from, host_matmul, Rng};
use rtpu_core::engine::{self, Arg, Output, TensorArg};
use rtpu_core::storage::{Storage, View};
use rtpu_core::{DType, ErrorCode};

const RTOL: f32 = 1e-5;
const ATOL: f32 = 1e-6;

fn op(name: &str) -> usize {
    engine::find_op(name).unwrap_or_else(|| panic!("{name} is not in the op table"))
}

fn i64_tensor(values: &[i64], sizes: &[i64]) -> TensorArg {
    let client = common::cpu_client();
    let storage = Storage::new(client, 0, values.len() * 8).unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    storage.write_host_bytes(&bytes, DType::I64).unwrap();
    TensorArg {
        storage,
        view: View::contiguous(sizes, DType::I64),
    }
}

fn read(t: &TensorArg) -> Vec<f32> {
    f32s_from(&t.storage.read_view(&t.view).unwrap())
}

fn call(name: &str, args: &[Arg]) -> Vec<TensorArg> {
    engine::call(common::cpu_client(), op(name), args)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .map(|out| match out {
            Output::New { storage, view } => TensorArg { storage, view },
            Output::Alias(i) => match &args[i] {
                Arg::Tensor(t) => t.clone(),
                _ => panic!("alias of a non-tensor"),
            },
            Output::None => panic!("{name} returned no tensor"),
        })
        .collect()
}

fn t(arg: &TensorArg) -> Arg {
    Arg::Tensor(arg.clone())
}

/// A view of `base`'s storage: `offset`, `sizes` and `strides` in elements of `dtype`.
fn view_of(
    base: &TensorArg,
    offset: i64,
    sizes: &[i64],
    strides: &[i64],
    dtype: DType,
) -> TensorArg {
    TensorArg {
        storage: base.storage.clone(),
        view: View {
            offset,
            sizes: sizes.into(),
            strides: strides.into(),
            dtype,
        },
    }
}

#[test]
fn add_broadcasts_with_alpha() {
    let mut rng = Rng::fresh("add");
    let (a, b) = (rng.f32s(6), rng.f32s(3));
    let out = call(
        "aten::add.Tensor",
        &[
            t(&f32_tensor(&a, &[2, 3])),
            t(&f32_tensor(&b, &[3])),
            Arg::Float(0.5),
        ],
    );
    let want: Vec<f32> = (0..6).map(|i| a[i] + 0.5 * b[i % 3]).collect();
    assert_eq!(out[0].view.sizes, vec![2, 3]);
    assert_close(&read(&out[0]), &want, RTOL, ATOL);
}

#[test]
fn reads_transposed_and_strided_views() {
    let mut rng = Rng::fresh("views");
    let a = rng.f32s(12);
    let base = f32_tensor(&a, &[3, 4]);
    // a.t(): sizes [4, 3], strides [1, 4]
    let transposed = view_of(&base, 0, &[4, 3], &[1, 4], DType::F32);
    let out = call("aten::mul.Scalar", &[t(&transposed), Arg::Float(2.0)]);
    let want: Vec<f32> = (0..12).map(|k| 2.0 * a[(k % 3) * 4 + k / 3]).collect();
    assert_close(&read(&out[0]), &want, 0.0, 0.0);
    // a[:, 1]: sizes [3], stride 4, offset 1 (not a permuted dense layout: a gather)
    let column = view_of(&base, 1, &[3], &[4], DType::F32);
    let out = call("aten::neg", &[t(&column)]);
    assert_close(&read(&out[0]), &[-a[1], -a[5], -a[9]], 0.0, 0.0);
    // expand: stride 0
    let row = f32_tensor(&a[..4], &[4]);
    let expanded = view_of(&row, 0, &[2, 4], &[0, 1], DType::F32);
    let out = call("aten::abs", &[t(&expanded)]);
    let want: Vec<f32> = (0..8).map(|k| a[k % 4].abs()).collect();
    assert_close(&read(&out[0]), &want, 0.0, 0.0);
}

#[test]
fn in_place_writes_through_views_show_in_the_base() {
    let mut rng = Rng::fresh("inplace");
    let a = rng.f32s(12);
    let base = f32_tensor(&a, &[3, 4]);
    // x[:, 1].add_(1)
    let column = view_of(&base, 1, &[3], &[4], DType::F32);
    call("aten::add_.Scalar", &[t(&column), Arg::Int(1), Arg::Int(1)]);
    let mut want = a.clone();
    for r in 0..3 {
        want[r * 4 + 1] += 1.0;
    }
    assert_close(&read(&base), &want, 0.0, 0.0);
    // y = x.t(); y.mul_(2)
    let transposed = view_of(&base, 0, &[4, 3], &[1, 4], DType::F32);
    call("aten::mul_.Scalar", &[t(&transposed), Arg::Float(2.0)]);
    let want: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
    assert_close(&read(&base), &want, 0.0, 0.0);
    // a contiguous row in the middle: x[1].zero_()
    let row = view_of(&base, 4, &[4], &[1], DType::F32);
    call("aten::zero_", &[t(&row)]);
    let got = read(&base);
    assert_eq!(&got[4..8], &[0.0; 4]);
    assert_close(&got[..4], &want[..4], 0.0, 0.0);
}

#[test]
fn addmm_and_mm_match_host() {
    let mut rng = Rng::fresh("addmm");
    let (x, w, bias) = (rng.f32s(8 * 5), rng.f32s(3 * 5), rng.f32s(3));
    let wt = f32_tensor(&w, &[3, 5]);
    // Linear: addmm(bias, x, w.t())
    let w_t = view_of(&wt, 0, &[5, 3], &[1, 5], DType::F32);
    let out = call(
        "aten::addmm",
        &[
            t(&f32_tensor(&bias, &[3])),
            t(&f32_tensor(&x, &[8, 5])),
            t(&w_t),
            Arg::Int(1),
            Arg::Int(1),
        ],
    );
    let w_transposed: Vec<f32> = (0..15).map(|k| w[(k % 3) * 5 + k / 3]).collect();
    let mm = host_matmul(&x, &w_transposed, 8, 5, 3);
    let want: Vec<f32> = mm
        .iter()
        .enumerate()
        .map(|(k, v)| v + bias[k % 3])
        .collect();
    assert_close(&read(&out[0]), &want, RTOL, 1e-5);
}

#[test]
fn log_softmax_nll_loss_and_backward() {
    let mut rng = Rng::fresh("nll");
    let logits = rng.f32s(4 * 5);
    let targets = [0i64, 3, 4, 1];
    let ls = call(
        "aten::_log_softmax",
        &[
            t(&f32_tensor(&logits, &[4, 5])),
            Arg::Int(1),
            Arg::Bool(false),
        ],
    );
    let mut want_ls = vec![0f32; 20];
    for r in 0..4 {
        let row = &logits[r * 5..(r + 1) * 5];
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
        for c in 0..5 {
            want_ls[r * 5 + c] = row[c] - lse;
        }
    }
    assert_close(&read(&ls[0]), &want_ls, 1e-5, 1e-6);
    let target = i64_tensor(&targets, &[4]);
    let out = call(
        "aten::nll_loss_forward",
        &[
            t(&ls[0]),
            t(&target),
            Arg::None,
            Arg::Int(1),
            Arg::Int(-100),
        ],
    );
    let want: f32 = -targets
        .iter()
        .enumerate()
        .map(|(r, &c)| want_ls[r * 5 + c as usize])
        .sum::<f32>()
        / 4.0;
    assert_close(&read(&out[0]), &[want], 1e-5, 1e-6);
    assert_close(&read(&out[1]), &[4.0], 0.0, 0.0);
    let grad = call(
        "aten::nll_loss_backward",
        &[
            t(&f32_tensor(&[1.0], &[])),
            t(&ls[0]),
            t(&target),
            Arg::None,
            Arg::Int(1),
            Arg::Int(-100),
            t(&out[1]),
        ],
    );
    let mut want_grad = vec![0f32; 20];
    for (r, &c) in targets.iter().enumerate() {
        want_grad[r * 5 + c as usize] = -0.25;
    }
    assert_close(&read(&grad[0]), &want_grad, 0.0, 0.0);

    let bad = i64_tensor(&[0, 7, 1, 1], &[4]);
    let err = engine::call(
        common::cpu_client(),
        op("aten::nll_loss_forward"),
        &[t(&ls[0]), t(&bad), Arg::None, Arg::Int(1), Arg::Int(-100)],
    )
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("Target 7 is out of bounds"),
        "{err}"
    );
}

#[test]
fn sum_mean_argmax() {
    let mut rng = Rng::fresh("reduce");
    let a = rng.f32s(12);
    let x = f32_tensor(&a, &[3, 4]);
    let s = call(
        "aten::sum.dim_IntList",
        &[t(&x), Arg::IntList(vec![1]), Arg::Bool(true), Arg::None],
    );
    assert_eq!(s[0].view.sizes, vec![3, 1]);
    let want: Vec<f32> = (0..3).map(|r| a[r * 4..(r + 1) * 4].iter().sum()).collect();
    assert_close(&read(&s[0]), &want, RTOL, ATOL);
    let m = call("aten::mean", &[t(&x), Arg::None]);
    assert_close(&read(&m[0]), &[a.iter().sum::<f32>() / 12.0], RTOL, ATOL);
    let am = call("aten::argmax", &[t(&x), Arg::Int(0), Arg::Bool(false)]);
    let got = read_i64(&am[0]);
    let want: Vec<i64> = (0..4)
        .map(|c| {
            (0..3)
                .max_by(|&i, &j| a[i * 4 + c].partial_cmp(&a[j * 4 + c]).unwrap())
                .unwrap() as i64
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn integer_true_division_promotes_to_float() {
    let x = i64_tensor(&[7, -7, 9], &[3]);
    let out = call("aten::div.Scalar", &[t(&x), Arg::Int(2)]);
    assert_eq!(out[0].view.dtype, DType::F32);
    assert_close(&read(&out[0]), &[3.5, -3.5, 4.5], 0.0, 0.0);
    let out = call(
        "aten::div.Scalar_mode",
        &[t(&x), Arg::Int(2), Arg::Str("floor".into())],
    );
    assert_eq!(out[0].view.dtype, DType::I64);
    let got = read_i64(&out[0]);
    assert_eq!(got, vec![3, -4, 4]);
}

#[test]
fn foreach_updates_every_tensor_in_one_call() {
    let mut rng = Rng::fresh("foreach");
    let (a, b, g1, g2) = (rng.f32s(4), rng.f32s(6), rng.f32s(4), rng.f32s(6));
    let (ta, tb) = (f32_tensor(&a, &[4]), f32_tensor(&b, &[2, 3]));
    let list = Arg::TensorList(vec![Some(ta.clone()), Some(tb.clone())]);
    let grads = Arg::TensorList(vec![
        Some(f32_tensor(&g1, &[4])),
        Some(f32_tensor(&g2, &[2, 3])),
    ]);
    let out = engine::call(
        common::cpu_client(),
        op("aten::_foreach_add_.List"),
        &[list, grads, Arg::Float(-0.1)],
    )
    .unwrap();
    assert!(out.is_empty());
    let stepped =
        |x: &[f32], g: &[f32]| -> Vec<f32> { x.iter().zip(g).map(|(x, g)| x - 0.1 * g).collect() };
    assert_close(&read(&ta), &stepped(&a, &g1), RTOL, ATOL);
    assert_close(&read(&tb), &stepped(&b, &g2), RTOL, ATOL);
}

#[test]
fn uniform_and_normal_have_the_right_statistics() {
    let client = common::cpu_client();
    let n = 20000;
    let storage = Storage::new(client, 0, n * 4).unwrap();
    let x = TensorArg {
        storage,
        view: View::contiguous(&[n as i64], DType::F32),
    };
    call(
        "aten::uniform_",
        &[
            t(&x),
            Arg::Float(-1.0),
            Arg::Float(3.0),
            Arg::Generator { seed: 7, offset: 0 },
        ],
    );
    let u = read(&x);
    assert!(u.iter().all(|&v| (-1.0..3.0).contains(&v)));
    let mean = u.iter().sum::<f32>() / n as f32;
    assert!((mean - 1.0).abs() < 0.05, "uniform mean {mean}");
    call(
        "aten::normal_",
        &[
            t(&x),
            Arg::Float(2.0),
            Arg::Float(0.5),
            Arg::Generator { seed: 7, offset: 1 },
        ],
    );
    let z = read(&x);
    let mean = z.iter().sum::<f32>() / n as f32;
    let var = z.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
    assert!(
        (mean - 2.0).abs() < 0.02 && (var.sqrt() - 0.5).abs() < 0.02,
        "normal mean {mean} std {}",
        var.sqrt()
    );
}

#[test]
fn bad_input_is_an_error_and_leaves_storage_intact() {
    let a = f32_tensor(&[1.0, 2.0, 3.0], &[3]);
    let b = f32_tensor(&[1.0, 2.0], &[2]);
    let err = engine::call(
        common::cpu_client(),
        op("aten::add_.Tensor"),
        &[t(&a), t(&b), Arg::Int(1)],
    )
    .err()
    .unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("broadcast"), "{err}");
    assert_eq!(read(&a), vec![1.0, 2.0, 3.0]);
    let idx = i64_tensor(&[0, 5], &[2]);
    let err = engine::call(
        common::cpu_client(),
        op("aten::index_select"),
        &[t(&a), Arg::Int(0), t(&idx)],
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("out of range"), "{err}");
    let ints = i64_tensor(&[1, 2, 3], &[3]);
    let err = engine::call(
        common::cpu_client(),
        op("aten::add_.Scalar"),
        &[t(&ints), Arg::Float(0.5), Arg::Int(1)],
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("castable"), "{err}");
}

#[test]
fn layer_norm_normalises_rows_and_returns_statistics() {
    let mut rng = Rng::fresh("layer_norm");
    let a = rng.f32s(3 * 8);
    let x = f32_tensor(&a, &[3, 8]);
    let out = call(
        "aten::native_layer_norm",
        &[
            t(&x),
            Arg::IntList(vec![8]),
            Arg::None,
            Arg::None,
            Arg::Float(1e-5),
        ],
    );
    assert_eq!(out[1].view.sizes, vec![3, 1]);
    let y = read(&out[0]);
    for r in 0..3 {
        let row = &a[r * 8..(r + 1) * 8];
        let mean = row.iter().sum::<f32>() / 8.0;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 8.0;
        let want: Vec<f32> = row
            .iter()
            .map(|v| (v - mean) / (var + 1e-5).sqrt())
            .collect();
        assert_close(&y[r * 8..(r + 1) * 8], &want, 1e-4, 1e-5);
        assert_close(&read(&out[1])[r..r + 1], &[mean], 1e-5, 1e-6);
    }
}

#[test]
fn gelu_tanh_matches_its_formula() {
    let mut rng = Rng::fresh("gelu");
    let a = rng.f32s(16);
    let out = call(
        "aten::gelu",
        &[t(&f32_tensor(&a, &[16])), Arg::Str("tanh".into())],
    );
    let want: Vec<f32> = a
        .iter()
        .map(|&x| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh()))
        .collect();
    assert_close(&read(&out[0]), &want, 1e-5, 1e-6);
}

#[test]
fn batch_norm_training_updates_running_statistics() {
    let mut rng = Rng::fresh("batch_norm");
    let a = rng.f32s(4 * 2 * 3);
    let x = f32_tensor(&a, &[4, 2, 3]);
    let (rm, rv) = (f32_tensor(&[0.0, 0.0], &[2]), f32_tensor(&[1.0, 1.0], &[2]));
    let out = call(
        "aten::native_batch_norm",
        &[
            t(&x),
            Arg::None,
            Arg::None,
            t(&rm),
            t(&rv),
            Arg::Bool(true),
            Arg::Float(0.1),
            Arg::Float(1e-5),
        ],
    );
    for c in 0..2 {
        let vals: Vec<f32> = (0..4)
            .flat_map(|n| (0..3).map(move |s| (n, s)))
            .map(|(n, s)| a[n * 6 + c * 3 + s])
            .collect();
        let mean = vals.iter().sum::<f32>() / 12.0;
        let var_unbiased = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 11.0;
        assert_close(&read(&rm)[c..c + 1], &[0.1 * mean], 1e-4, 1e-6);
        assert_close(
            &read(&rv)[c..c + 1],
            &[0.9 + 0.1 * var_unbiased],
            1e-4,
            1e-6,
        );
        assert_close(&read(&out[1])[c..c + 1], &[mean], 1e-4, 1e-6);
    }
}

#[test]
fn embedding_backward_accumulates_repeated_indices() {
    let grad = f32_tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let idx = i64_tensor(&[2, 0, 2], &[3]);
    let out = call(
        "aten::embedding_dense_backward",
        &[
            t(&grad),
            t(&idx),
            Arg::Int(4),
            Arg::Int(-1),
            Arg::Bool(false),
        ],
    );
    assert_eq!(out[0].view.sizes, vec![4, 2]);
    assert_close(
        &read(&out[0]),
        &[3.0, 4.0, 0.0, 0.0, 6.0, 8.0, 0.0, 0.0],
        0.0,
        0.0,
    );
    let out = call(
        "aten::embedding_dense_backward",
        &[t(&grad), t(&idx), Arg::Int(4), Arg::Int(0), Arg::Bool(true)],
    );
    assert_close(
        &read(&out[0]),
        &[0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0],
        0.0,
        0.0,
    );
}

/// Naive host conv2d: x [N, C, H, W], w [O, C/g, KH, KW].
#[allow(clippy::too_many_arguments)]
fn host_conv2d(
    x: &[f32],
    xd: [usize; 4],
    w: &[f32],
    wd: [usize; 4],
    stride: usize,
    pad: usize,
    dil: usize,
    groups: usize,
) -> (Vec<f32>, [usize; 4]) {
    let [n, c, h, wi] = xd;
    let [o, cg, kh, kw] = wd;
    let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let ow = (wi + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let mut out = vec![0f32; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            let grp = oc / (o / groups);
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = 0f64;
                    for ic in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy = (y * stride + i * dil) as i64 - pad as i64;
                                let ix = (xx * stride + j * dil) as i64 - pad as i64;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wi as i64 {
                                    continue;
                                }
                                let cin = grp * cg + ic;
                                acc += x[((b * c + cin) * h + iy as usize) * wi + ix as usize]
                                    as f64
                                    * w[((oc * cg + ic) * kh + i) * kw + j] as f64;
                            }
                        }
                    }
                    out[((b * o + oc) * oh + y) * ow + xx] = acc as f32;
                }
            }
        }
    }
    (out, [n, o, oh, ow])
}

#[test]
fn convolution_matches_host_and_its_backward_is_its_adjoint() {
    let mut rng = Rng::fresh("conv");
    let (xd, wd) = ([2usize, 4, 7, 6], [6usize, 2, 3, 3]);
    let x = rng.f32s(xd.iter().product());
    let w = rng.f32s(wd.iter().product());
    let (want, od) = host_conv2d(&x, xd, &w, wd, 2, 1, 1, 2);
    let dims = |d: [usize; 4]| d.iter().map(|&v| v as i64).collect::<Vec<_>>();
    let (tx, tw) = (f32_tensor(&x, &dims(xd)), f32_tensor(&w, &dims(wd)));
    // Stride, padding, dilation, transposed, output padding, groups.
    let geometry = |transposed: bool, output_padding: Vec<i64>| {
        vec![
            Arg::IntList(vec![2, 2]),
            Arg::IntList(vec![1, 1]),
            Arg::IntList(vec![1, 1]),
            Arg::Bool(transposed),
            Arg::IntList(output_padding),
            Arg::Int(2),
        ]
    };
    let mut args = vec![t(&tx), t(&tw), Arg::None];
    args.extend(geometry(false, vec![0, 0]));
    let y = call("aten::convolution", &args);
    assert_eq!(y[0].view.sizes, dims(od));
    assert_close(&read(&y[0]), &want, 1e-4, 1e-5);

    // <conv(x), gy> == <x, grad_input(gy)> and grad_weight likewise.
    let gy = rng.f32s(od.iter().product());
    let tgy = f32_tensor(&gy, &dims(od));
    let mut args = vec![t(&tgy), t(&tx), t(&tw), Arg::IntList(vec![6])];
    args.extend(geometry(false, vec![0, 0]));
    args.push(Arg::IntList(vec![1, 1, 1]));
    let grads = call("aten::convolution_backward", &args);
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(p, q)| *p as f64 * *q as f64)
            .sum::<f64>()
    };
    let lhs = dot(&want, &gy);
    let gx = read(&grads[0]);
    assert_eq!(grads[0].view.sizes, dims(xd));
    let assert_adjoint = |what: &str, a: &[f32], b: &[f32]| {
        let rhs = dot(a, b);
        assert!(
            (lhs - rhs).abs() < 1e-3 * lhs.abs().max(1.0),
            "{what} adjoint {lhs} vs {rhs}"
        );
    };
    assert_adjoint("input", &x, &gx);
    let gw = read(&grads[1]);
    assert_eq!(grads[1].view.sizes, dims(wd));
    assert_adjoint("weight", &w, &gw);
    let gb = read(&grads[2]);
    for (o, v) in gb.iter().enumerate() {
        let want: f32 = (0..2)
            .flat_map(|n| (0..od[2] * od[3]).map(move |k| (n, k)))
            .map(|(n, k)| gy[(n * 6 + o) * od[2] * od[3] + k])
            .sum();
        assert!((v - want).abs() < 1e-4, "bias grad {o}");
    }

    // A transposed convolution is the input gradient of the standard one.
    let mut args = vec![t(&tgy), t(&tw), Arg::None];
    args.extend(geometry(true, vec![0, 1]));
    let yt = call("aten::convolution", &args);
    assert_eq!(yt[0].view.sizes, dims(xd));
    assert_close(&read(&yt[0]), &gx, 1e-4, 1e-5);
}

#[test]
fn max_pool_picks_first_maxima_and_routes_gradients() {
    // One 4x4 plane with a tie in the first window.
    let x: Vec<f32> = vec![
        1.0, 5.0, 2.0, 0.0, 5.0, 3.0, 7.0, 7.0, 0.0, 1.0, 2.0, 3.0, 4.0, 9.0, 3.0, 8.0,
    ];
    let tx = f32_tensor(&x, &[1, 1, 4, 4]);
    // Kernel, stride, padding, dilation, ceil_mode.
    let window = [
        Arg::IntList(vec![2, 2]),
        Arg::IntList(vec![2, 2]),
        Arg::IntList(vec![0, 0]),
        Arg::IntList(vec![1, 1]),
        Arg::Bool(false),
    ];
    let mut args = vec![t(&tx)];
    args.extend(window.iter().cloned());
    let out = call("aten::max_pool2d_with_indices", &args);
    assert_close(&read(&out[0]), &[5.0, 7.0, 9.0, 8.0], 0.0, 0.0);
    let idx = read_i64(&out[1]);
    assert_eq!(idx, vec![1, 6, 13, 15]);
    let gy = f32_tensor(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
    let mut args = vec![t(&gy), t(&tx)];
    args.extend(window);
    args.push(t(&out[1]));
    let gx = call("aten::max_pool2d_with_indices_backward", &args);
    let mut want = vec![0f32; 16];
    for (i, &p) in idx.iter().enumerate() {
        want[p as usize] += (i + 1) as f32;
    }
    assert_close(&read(&gx[0]), &want, 0.0, 0.0);
}

#[test]
fn average_pools_match_host() {
    let mut rng = Rng::fresh("avg_pool");
    let x = rng.f32s(2 * 5 * 6);
    let tx = f32_tensor(&x, &[2, 5, 6]);
    // 3x3 windows, stride 2, padding 1, count_include_pad=false.
    let out = call(
        "aten::avg_pool2d",
        &[
            t(&tx),
            Arg::IntList(vec![3, 3]),
            Arg::IntList(vec![2, 2]),
            Arg::IntList(vec![1, 1]),
            Arg::Bool(false),
            Arg::Bool(false),
            Arg::None,
        ],
    );
    assert_eq!(out[0].view.sizes, vec![2, 3, 3]);
    let mut want = Vec::new();
    for p in 0..2 {
        for oh in 0..3i64 {
            for ow in 0..3i64 {
                let (mut sum, mut n) = (0f32, 0f32);
                for kh in 0..3 {
                    for kw in 0..3 {
                        let (r, c) = (oh * 2 - 1 + kh, ow * 2 - 1 + kw);
                        if (0..5).contains(&r) && (0..6).contains(&c) {
                            sum += x[p * 30 + (r * 6 + c) as usize];
                            n += 1.0;
                        }
                    }
                }
                want.push(sum / n);
            }
        }
    }
    assert_close(&read(&out[0]), &want, 1e-5, 1e-6);
    // Adaptive to 2x3: rows [0,3) and [2,5), columns in pairs.
    let out = call(
        "aten::_adaptive_avg_pool2d",
        &[t(&tx), Arg::IntList(vec![2, 3])],
    );
    let mut want = Vec::new();
    for p in 0..2 {
        for (r0, r1) in [(0, 3), (2, 5)] {
            for c0 in [0, 2, 4] {
                let vals: Vec<f32> = (r0..r1)
                    .flat_map(|r| (c0..c0 + 2).map(move |c| (r, c)))
                    .map(|(r, c)| x[p * 30 + r * 6 + c])
                    .collect();
                want.push(vals.iter().sum::<f32>() / vals.len() as f32);
            }
        }
    }
    assert_close(&read(&out[0]), &want, 1e-5, 1e-6);
}

#[test]
fn remainder_follows_the_divisor_and_fmod_the_dividend() {
    let a = f32_tensor(&[5.0, -5.0, 5.0, -5.0], &[4]);
    let b = f32_tensor(&[3.0, 3.0, -3.0, -3.0], &[4]);
    let r = call("aten::remainder.Tensor", &[t(&a), t(&b)]);
    assert_close(&read(&r[0]), &[2.0, 1.0, -1.0, -2.0], 0.0, 0.0);
    let f = call("aten::fmod.Tensor", &[t(&a), t(&b)]);
    assert_close(&read(&f[0]), &[2.0, -2.0, 2.0, -2.0], 0.0, 0.0);
    let e = call("aten::erf", &[t(&f32_tensor(&[0.0, 0.5, -1.0], &[3]))]);
    assert_close(&read(&e[0]), &[0.0, 0.520_499_9, -0.842_700_8], 1e-5, 1e-6);
    let tr = call("aten::trunc", &[t(&f32_tensor(&[1.7, -1.7, 0.2], &[3]))]);
    assert_close(&read(&tr[0]), &[1.0, -1.0, 0.0], 0.0, 0.0);
}

#[test]
fn sort_topk_cumsum_and_var() {
    let x = f32_tensor(&[3.0, 1.0, 2.0, 1.0, f32::NAN, -1.0], &[2, 3]);
    let s = call("aten::sort", &[t(&x), Arg::Int(1), Arg::Bool(false)]);
    let v = read(&s[0]);
    assert_eq!(&v[..3], &[1.0, 2.0, 3.0]);
    assert_eq!(&v[3..5], &[-1.0, 1.0]);
    assert!(v[5].is_nan(), "NaN sorts last ascending");
    let idx = read_i64(&s[1]);
    assert_eq!(idx, vec![1, 2, 0, 2, 0, 1]);
    let k = call(
        "aten::topk",
        &[
            t(&f32_tensor(&[1.0, 5.0, 3.0, 5.0], &[4])),
            Arg::Int(2),
            Arg::Int(0),
            Arg::Bool(true),
            Arg::Bool(true),
        ],
    );
    assert_close(&read(&k[0]), &[5.0, 5.0], 0.0, 0.0);
    let c = call(
        "aten::cumsum",
        &[
            t(&f32_tensor(&[1.0, 2.0, 3.0, 4.0], &[2, 2])),
            Arg::Int(1),
            Arg::None,
        ],
    );
    assert_close(&read(&c[0]), &[1.0, 3.0, 3.0, 7.0], 0.0, 0.0);
    let v = call(
        "aten::var.correction",
        &[
            t(&f32_tensor(&[1.0, 2.0, 3.0, 4.0], &[4])),
            Arg::None,
            Arg::None,
            Arg::Bool(false),
        ],
    );
    assert_close(&read(&v[0]), &[5.0 / 3.0], 1e-6, 0.0);
}

fn read_i64(t: &TensorArg) -> Vec<i64> {
    t.storage
        .read_view(&t.view)
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Equal as torch compares with `equal_nan`: NaN where the other is NaN,
/// the same value (and sign of zero) elsewhere.
fn assert_same_or_both_nan(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "element {i}: got {g}, want {w}");
    }
}

#[test]
fn nan_wins_extremes_sorts_last_and_has_sign_zero_as_in_torch() {
    let mut rng = Rng::fresh("nan_extremes");
    let (rows, cols) = (4, 7);
    let mut a = rng.f32s(rows * cols);
    // Rows 0 and 2 get NaNs (row 0 two, the first of them negative), rows
    // 1 and 3 none; row 3 an infinity.
    for (r, c) in [
        (0, rng.next_u64() as usize % 3),
        (0, 5),
        (2, rng.next_u64() as usize % cols),
    ] {
        a[r * cols + c] = f32::NAN;
    }
    a[rng.next_u64() as usize % 3] = -f32::NAN;
    a[3 * cols + 4] = f32::INFINITY;
    let x = f32_tensor(&a, &[rows as i64, cols as i64]);
    // torch: a NaN is the extreme of both kinds, and the first one wins.
    let row = |r: usize| &a[r * cols..(r + 1) * cols];
    let first = |r: usize, better: fn(f32, f32) -> bool| {
        let v = row(r);
        (0..cols).fold(0, |best, c| {
            if v[best].is_nan() || (!v[c].is_nan() && !better(v[c], v[best])) {
                best
            } else {
                c
            }
        })
    };
    let argmax: Vec<i64> = (0..rows).map(|r| first(r, |x, y| x > y) as i64).collect();
    let argmin: Vec<i64> = (0..rows).map(|r| first(r, |x, y| x < y) as i64).collect();
    let amax: Vec<f32> = (0..rows).map(|r| row(r)[argmax[r] as usize]).collect();
    let amin: Vec<f32> = (0..rows).map(|r| row(r)[argmin[r] as usize]).collect();

    let got = call(
        "aten::amax",
        &[t(&x), Arg::IntList(vec![1]), Arg::Bool(false)],
    );
    assert_same_or_both_nan(&read(&got[0]), &amax);
    let got = call(
        "aten::amin",
        &[t(&x), Arg::IntList(vec![1]), Arg::Bool(false)],
    );
    assert_same_or_both_nan(&read(&got[0]), &amin);
    let got = call("aten::argmax", &[t(&x), Arg::Int(1), Arg::Bool(false)]);
    assert_eq!(read_i64(&got[0]), argmax);
    let got = call("aten::argmin", &[t(&x), Arg::Int(1), Arg::Bool(false)]);
    assert_eq!(read_i64(&got[0]), argmin);
    let got = call("aten::max.dim", &[t(&x), Arg::Int(1), Arg::Bool(false)]);
    assert_same_or_both_nan(&read(&got[0]), &amax);
    assert_eq!(read_i64(&got[1]), argmax);
    let got = call("aten::max", &[t(&x)]);
    assert!(read(&got[0])[0].is_nan(), "max of all holds the NaNs");

    // Stable sorts: NaNs of either sign last (first descending) in input
    // order, -0.0 and 0.0 equal, in input order.
    let s = f32_tensor(
        &[1.0, -0.0, 0.0, -f32::NAN, f32::NAN, f32::NEG_INFINITY, 0.0],
        &[7],
    );
    let up = call("aten::sort", &[t(&s), Arg::Int(0), Arg::Bool(false)]);
    assert_eq!(read_i64(&up[1]), vec![5, 1, 2, 6, 0, 3, 4]);
    let down = call("aten::sort", &[t(&s), Arg::Int(0), Arg::Bool(true)]);
    assert_eq!(read_i64(&down[1]), vec![3, 4, 0, 1, 2, 6, 5]);

    // sign: (x > 0) - (x < 0), so NaN and -0.0 give +0.0.
    let v = f32_tensor(&[f32::NAN, -0.0, -2.5, 3.0, f32::NEG_INFINITY], &[5]);
    let got = call("aten::sign", &[t(&v)]);
    assert_same_or_both_nan(&read(&got[0]), &[0.0, 0.0, -1.0, 1.0, -1.0]);
}

#[test]
fn advanced_indexing_and_scatter() {
    // x[[2, 0], :] and x[:, [1, 1]] on a 3x2 tensor.
    let x = f32_tensor(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]);
    let rows = i64_tensor(&[2, 0], &[2]);
    let out = call(
        "aten::index.Tensor",
        &[t(&x), Arg::TensorList(vec![Some(rows.clone())])],
    );
    assert_eq!(out[0].view.sizes, vec![2, 2]);
    assert_close(&read(&out[0]), &[4.0, 5.0, 0.0, 1.0], 0.0, 0.0);
    let cols = i64_tensor(&[1, -1], &[2]);
    let out = call(
        "aten::index.Tensor",
        &[t(&x), Arg::TensorList(vec![None, Some(cols)])],
    );
    assert_close(&read(&out[0]), &[1.0, 1.0, 3.0, 3.0, 5.0, 5.0], 0.0, 0.0);
    // index_put_ with accumulate and a repeated index.
    let idx = i64_tensor(&[1, 1], &[2]);
    let vals = f32_tensor(&[10.0, 20.0, 30.0, 40.0], &[2, 2]);
    call(
        "aten::index_put_",
        &[
            t(&x),
            Arg::TensorList(vec![Some(idx)]),
            t(&vals),
            Arg::Bool(true),
        ],
    );
    assert_close(&read(&x), &[0.0, 1.0, 42.0, 63.0, 4.0, 5.0], 0.0, 0.0);
    // scatter_add along dim 1.
    let base = f32_tensor(&[0.0; 6], &[2, 3]);
    let sidx = i64_tensor(&[0, 2, 2, 1], &[2, 2]);
    let src = f32_tensor(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let out = call(
        "aten::scatter_add",
        &[t(&base), Arg::Int(1), t(&sidx), t(&src)],
    );
    assert_close(&read(&out[0]), &[1.0, 0.0, 2.0, 0.0, 4.0, 3.0], 0.0, 0.0);
    let bad = i64_tensor(&[0, 3], &[1, 2]);
    let err = engine::call(
        common::cpu_client(),
        op("aten::scatter_add"),
        &[t(&base), Arg::Int(1), t(&bad), t(&src)],
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("out of bounds"), "{err}");
}

#[test]
fn markers_cover_launched_work_and_time_it() {
    use rtpu_core::engine::{deferred, work::Marker};

    let client = common::cpu_client();
    // A device no other test here uses, so only this test's work is on it.
    let device = client.device_count() - 1;
    let n = 256;
    let identity: Vec<f32> = (0..n * n)
        .map(|k| if k % (n + 1) == 0 { 1.0 } else { 0.0 })
        .collect();
    let storage = Storage::new(client, device, identity.len() * 4).unwrap();
    storage
        .write_host_bytes(&f32_bytes(&identity), DType::F32)
        .unwrap();
    let x = TensorArg {
        storage,
        view: View::contiguous(&[n as i64, n as i64], DType::F32),
    };
    // synchronize waits for eager work too: nothing is left in flight.
    deferred::synchronize().unwrap();
    let start = Marker::new(client, device).unwrap();
    assert!(start.finished_at().unwrap().is_some());

    let mut y = x.clone();
    for _ in 0..20 {
        y = call("aten::mm", &[t(&y), t(&x)]).remove(0);
    }
    let end = Marker::new(client, device).unwrap();
    end.wait().unwrap();
    assert!(end.finished_at().unwrap().is_some());
    let ms = start.elapsed_ms(&end).unwrap().expect("both finished");
    assert!(ms > 0.0, "{ms}");
    assert_eq!(end.elapsed_ms(&start).unwrap(), Some(-ms));
    assert_eq!(read(&y), identity);

    let bad = Marker::new(client, client.device_count())
        .err()
        .expect("out of range");
    assert_eq!(bad.code(), ErrorCode::InvalidArgument);
}
