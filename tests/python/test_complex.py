"""Complex tensors on tpu: the ops XLA computes natively match CPU; the views
`.real`, `.imag`, `view_as_real` and `view_as_complex` read and write the
complex storage; what rtpu does not lower (fft, real-only formulas, scalars
with an imaginary part) runs on the CPU with the fallback warning and
counter, never a wrong answer or a compiler error."""

import warnings

import pytest
import torch

import rtpu
from conftest import assert_matches_cpu

DEVICE = "tpu"


def fresh(*sizes, dtype=torch.complex64):
    return torch.randn(*sizes, dtype=dtype)


def fallbacks() -> dict:
    return dict(rtpu.metrics()["cpu_fallbacks"])


def run_on_tpu(fn, *inputs):
    """`fn` on tpu copies of `inputs`, with the ops that fell back to the CPU."""
    before = fallbacks()
    got = fn(*(x.to(DEVICE) for x in inputs))
    after = fallbacks()
    return got, {op for op, n in after.items() if n != before.get(op, 0)}


NATIVE = {
    "abs": lambda x: x.abs(),
    "angle": lambda x: x.angle(),
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "asinh": torch.asinh,
    "reciprocal": torch.reciprocal,
    "sgn": torch.sgn,
    "neg": torch.neg,
    "conj_physical": torch.conj_physical,
    "real": lambda x: x.real * 1,
    "imag": lambda x: x.imag * 1,
    "view_as_real": lambda x: torch.view_as_real(x) + 0,
    "sum": lambda x: x.sum(dim=0),
    "mean": lambda x: x.mean(),
    "trace": torch.trace,
    "mul_conj": lambda x: x * x.conj(),
    "div": lambda x: x / (x + 2),
    "matmul": lambda x: x @ x.T,
    "vdot": lambda x: torch.vdot(x[0], x[1]),
    "eq": lambda x: x == x.flip(0),
    "isnan": torch.isnan,
    "float_scalar": lambda x: x * 2.5,
    "cat": lambda x: torch.cat([x, x.conj()]),
}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("name", NATIVE)
def test_complex_ops_match_cpu_natively(name, dtype):
    x = fresh(3, 3, dtype=dtype)
    got, fell_back = run_on_tpu(NATIVE[name], x)
    assert not fell_back, f"{name} fell back: {fell_back}"
    assert_matches_cpu(got, NATIVE[name](x))


def test_writes_through_real_and_imag_views_change_the_complex_tensor():
    x = fresh(4, 3)
    t = x.to(DEVICE)
    for y in (x, t):
        y.real.mul_(2)
        y.imag[1:].zero_()
        torch.view_as_real(y)[0, 0, 1] = 7.0
    assert_matches_cpu(t, x)
    pairs = torch.randn(4, 3, 2)
    assert_matches_cpu(torch.view_as_complex(pairs.to(DEVICE)) * 2, torch.view_as_complex(pairs) * 2)


def test_complex_views_and_ops_in_a_step_match_cpu():
    x = fresh(4, 3)
    t = x.to(DEVICE)
    with rtpu.step():
        magnitude = t.abs() + t.real
        t.imag.add_(1)
    want = x.abs() + x.real
    x.imag.add_(1)
    assert_matches_cpu(magnitude, want)
    assert_matches_cpu(t, x)


CPU_RUN = {
    "fft": (torch.fft.fft, "aten::_fft_c2c"),
    "rfft": (lambda x: torch.fft.rfft(x.real), "aten::_fft_r2c"),
    "irfft": (torch.fft.irfft, "aten::_fft_c2r"),
    "sinc": (torch.sinc, "aten::sinc"),
    "logaddexp": (lambda x: torch.logaddexp(x, x.flip(0)), "aten::logaddexp"),
    "imaginary_scalar": (lambda x: x * (1 + 2j), "aten::mul.Tensor"),
    "complex_fill": (lambda x: torch.full_like(x, 1 - 1j), "aten::fill_.Scalar"),
}


@pytest.mark.parametrize("name", CPU_RUN)
def test_what_is_not_lowered_runs_on_the_cpu_with_a_warning_and_matches(name):
    fn, op = CPU_RUN[name]
    x = fresh(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, fell_back = run_on_tpu(fn, x)
    assert op in fell_back
    assert_matches_cpu(got, fn(x))
    # The warning is shown once per op per process; when it was, it says where.
    for w in caught:
        if "runs on the CPU" in str(w.message):
            assert op.removeprefix("aten::").split(".")[0] in str(w.message)


@pytest.mark.parametrize("fn", [torch.floor, torch.sign, torch.erf])
def test_ops_cpu_refuses_for_complex_are_refused_on_tpu_too(fn):
    x = fresh(3)
    with pytest.raises((RuntimeError, NotImplementedError)):
        fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises((RuntimeError, NotImplementedError)):
            fn(x.to(DEVICE)).cpu()
