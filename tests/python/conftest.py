"""Shared setup: the `tpu` device, whether or not autoload is enabled."""

import atexit
import os
import shutil
import sys
import tempfile

import pytest
import torch

import rtpu  # noqa: F401  (registers the device when autoload is off)

# The examples' modules the tests share with them and the benchmarks: the
# GPT (gpt) and the training step (training).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

# A compile cache of the session's own: tests count compiles, and the user's
# cache stays untouched.
_CACHE_DIR = tempfile.mkdtemp(prefix="rtpu-test-cache-")
os.environ["RTPU_CACHE_DIR"] = _CACHE_DIR
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)

# Explicit per-dtype tolerances for results computed by XLA against the same
# computation on the CPU (summation order and fused ops may differ).
TOLERANCES = {
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
    torch.complex64: {"rtol": 1e-5, "atol": 1e-5},
    torch.complex128: {"rtol": 1e-12, "atol": 1e-12},
}


def assert_matches_cpu(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """`actual` (a tpu tensor) equals the CPU result within its dtype's tolerance."""
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    tolerance = TOLERANCES.get(expected.dtype, {"rtol": 0, "atol": 0})
    torch.testing.assert_close(actual.cpu(), expected, **tolerance)


def twins(make_model):
    """The same fresh model (`make_model()`) on the CPU and on tpu."""
    model_cpu = make_model()
    model = make_model()
    model.load_state_dict(model_cpu.state_dict())
    return model_cpu, model.to("tpu")


@pytest.fixture
def two_devices():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two tpu devices")
