//! Op calls the fuzzer (`scripts/fuzz op_call`) found panicking inside a
//! lowering (index out of range, arithmetic overflow, division by zero):
//! through the C ABI a PANIC error, in debug builds an abort. Each is now
//! refused up front with INVALID_ARGUMENT naming what was wrong.

mod common;

use rtpu_core::engine::{self, Arg, TensorArg};
use rtpu_core::storage::{Storage, View};
use rtpu_core::{DType, ErrorCode};

/// A float32 tensor of `sizes`, all zeros.
fn zeros(sizes: &[i64]) -> Arg {
    let numel: i64 = sizes.iter().product();
    let storage = Storage::new(common::cpu_client(), 0, numel as usize * 4).unwrap();
    Arg::Tensor(TensorArg {
        storage,
        view: View::contiguous(sizes, DType::F32),
    })
}

/// Asserts `name` refuses `args` with INVALID_ARGUMENT mentioning `needle`.
fn refused(name: &str, args: &[Arg], needle: &str) {
    let op = engine::find_op(name).unwrap_or_else(|| panic!("{name} is not in the op table"));
    match engine::call(common::cpu_client(), op, args) {
        Ok(_) => panic!("{name} accepted {} arguments it should refuse", args.len()),
        Err(err) => {
            assert_eq!(err.code(), ErrorCode::InvalidArgument, "{name}: {err}");
            assert!(err.to_string().contains(needle), "{name}: {err}");
        }
    }
}

#[test]
fn dim_wise_ops_refuse_0_d_tensors() {
    // wrap_dim accepts dim 0 of a 0-d tensor; these then indexed its sizes.
    refused(
        "aten::glu",
        &[zeros(&[]), Arg::Int(0)],
        "at least 1 dimension",
    );
    refused(
        "aten::glu_backward",
        &[zeros(&[]), zeros(&[]), Arg::Int(-1)],
        "at least 1 dimension",
    );
    refused(
        "aten::linalg_cross",
        &[zeros(&[]), zeros(&[]), Arg::Int(0)],
        "at least 1 dimension",
    );
}

#[test]
fn batch_norm_backward_refuses_inputs_without_channels() {
    let mask = Arg::IntList(vec![1, 1, 1]);
    for sizes in [&[][..], &[3][..]] {
        refused(
            "aten::native_batch_norm_backward",
            &[
                zeros(sizes),
                zeros(sizes),
                Arg::None,
                Arg::None,
                Arg::None,
                Arg::None,
                Arg::None,
                Arg::Bool(true),
                Arg::Float(1e-5),
                mask.clone(),
            ],
            "at least 2 dimensions",
        );
    }
}

#[test]
fn pooling_backwards_and_col2im_refuse_non_images() {
    let pair = |v: i64| Arg::IntList(vec![v, v]);
    refused(
        "aten::max_pool2d_with_indices_backward",
        &[
            zeros(&[2]),
            zeros(&[2]),
            pair(1),
            pair(1),
            pair(0),
            pair(1),
            Arg::Bool(false),
            zeros(&[2]),
        ],
        "3-D or 4-D",
    );
    refused(
        "aten::avg_pool2d_backward",
        &[
            zeros(&[]),
            zeros(&[]),
            pair(1),
            pair(1),
            pair(0),
            Arg::Bool(false),
            Arg::Bool(true),
            Arg::None,
        ],
        "3-D or 4-D",
    );
    // A gradient of another rank than the image it is for.
    refused(
        "aten::_adaptive_avg_pool2d_backward",
        &[zeros(&[2]), zeros(&[1, 2, 2])],
        "gradient",
    );
    refused(
        "aten::col2im",
        &[zeros(&[]), pair(2), pair(1), pair(1), pair(0), pair(1)],
        "2-D or 3-D",
    );
}

#[test]
fn window_geometry_out_of_range_is_refused() {
    let pair = |v: i64| Arg::IntList(vec![v, v]);
    let image = || zeros(&[1, 4, 4]);
    // A zero stride divided by zero; a huge padding overflowed.
    for (stride, padding) in [(0, 0), (1, i64::MAX), (i64::MAX, 0)] {
        refused(
            "aten::max_pool2d_with_indices",
            &[
                image(),
                pair(2),
                pair(stride),
                pair(padding),
                pair(1),
                Arg::Bool(true),
            ],
            "geometry",
        );
        refused(
            "aten::im2col",
            &[image(), pair(2), pair(1), pair(padding), pair(stride)],
            "geometry",
        );
    }
    refused(
        "aten::avg_pool2d_backward",
        &[
            zeros(&[1, 2, 2]),
            image(),
            pair(2),
            pair(0),
            pair(0),
            Arg::Bool(false),
            Arg::Bool(true),
            Arg::None,
        ],
        "geometry",
    );
    // A zero kernel was a remainder by zero.
    refused(
        "aten::col2im",
        &[zeros(&[4, 4]), pair(4), pair(0), pair(1), pair(0), pair(1)],
        "kernel_size",
    );
}

#[test]
fn bucketize_and_searchsorted_refuse_0_d_sequences() {
    refused(
        "aten::bucketize.Tensor",
        &[zeros(&[3]), zeros(&[]), Arg::Bool(false), Arg::Bool(false)],
        "boundaries",
    );
    refused(
        "aten::searchsorted.Tensor",
        &[
            zeros(&[]),
            zeros(&[3]),
            Arg::Bool(false),
            Arg::Bool(false),
            Arg::None,
            Arg::None,
        ],
        "sorted_sequence",
    );
}

#[test]
fn remainders_refuse_complex_tensors() {
    // XLA's CPU compiler segfaulted compiling fmod_ of a complex128 tensor.
    let storage = Storage::new(common::cpu_client(), 0, 2 * 16).unwrap();
    let complex = Arg::Tensor(TensorArg {
        storage,
        view: View::contiguous(&[2, 1], DType::C128),
    });
    refused(
        "aten::fmod_.Scalar",
        &[complex.clone(), Arg::Int(-3)],
        "complex",
    );
    refused("aten::remainder.Scalar", &[complex, Arg::Int(2)], "complex");
}

#[test]
fn outputs_whose_element_count_overflows_are_refused() {
    // eye(n, m) with n * m past 2^63 overflowed counting its output.
    let out = zeros(&[0]);
    refused(
        "aten::eye.m_out",
        &[Arg::Int(1 << 40), Arg::Int(1 << 40), out],
        "fit in 64 bits",
    );
}

#[test]
fn empty_inputs_with_huge_sizes_are_refused_before_lowering() {
    // A 0 makes these empty, but their other sizes have no contiguous
    // strides in 64 bits: neg's output view overflowed computing them, and
    // upsample's lowering multiplying the leading sizes. Such views are
    // refused for every op before it lowers.
    let empty = strided(0, &[0, i64::MAX, 5, 1], &[i64::MAX, 5, 1, 1]);
    refused("aten::neg", &[Arg::Tensor(empty)], "fit in 64 bits");
    let empty = Arg::Tensor(strided(0, &[1 << 62, 4, 0], &[0, 0, 1]));
    refused(
        "aten::upsample_nearest1d",
        &[empty, Arg::IntList(vec![2]), Arg::None],
        "fit in 64 bits",
    );
}

/// A float32 view of `sizes` and `strides` over a zeroed storage of `elements`.
fn strided(elements: usize, sizes: &[i64], strides: &[i64]) -> TensorArg {
    TensorArg {
        storage: Storage::new(common::cpu_client(), 0, elements * 4).unwrap(),
        view: View {
            offset: 0,
            sizes: sizes.into(),
            strides: strides.into(),
            dtype: DType::F32,
        },
    }
}

#[test]
fn writes_through_views_that_repeat_elements_are_refused() {
    // add_ on a [2^31, 1] expansion of one element built a 2^31-entry
    // scatter that XLA could not allocate: the process aborted.
    let expanded = strided(1, &[1 << 31, 1], &[0, 1]);
    refused(
        "aten::add_.Tensor",
        &[
            Arg::Tensor(expanded.clone()),
            Arg::Tensor(expanded),
            Arg::Int(1),
        ],
        "no storage element appears twice",
    );
    // Overlapping rows without a stride of 0: 9 elements over 5.
    let overlapping = Arg::Tensor(strided(5, &[3, 3], &[1, 1]));
    refused(
        "aten::mul_.Scalar",
        &[overlapping, Arg::Float(2.0)],
        "no storage element appears twice",
    );
}

#[test]
fn one_value_written_through_an_expanded_view_fills_each_element_once() {
    // fill_ and zero_ of an expanded tensor are well-defined, as in ATen.
    let expanded = strided(3, &[1 << 40, 3], &[0, 1]);
    let fill = engine::find_op("aten::fill_.Scalar").unwrap();
    engine::call(
        common::cpu_client(),
        fill,
        &[Arg::Tensor(expanded.clone()), Arg::Float(2.5)],
    )
    .unwrap();
    let whole = View::contiguous(&[3], DType::F32);
    let got = common::f32s_from(&expanded.storage.read_view(&whole).unwrap());
    assert_eq!(got, [2.5, 2.5, 2.5]);
}
