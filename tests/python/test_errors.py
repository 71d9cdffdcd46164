"""Bad input is a Python exception with a clear message; the process lives on."""

import pytest
import torch


def test_mismatched_shapes():
    a = torch.ones(2, 3, device="tpu")
    b = torch.ones(4, 5, device="tpu")
    with pytest.raises(RuntimeError, match=r"aten::add.*broadcast"):
        a + b
    # Still usable afterwards.
    assert torch.equal((a + 1).cpu(), torch.full((2, 3), 2.0))


def test_matmul_shape_mismatch():
    with pytest.raises(RuntimeError, match="mm"):
        torch.ones(2, 3, device="tpu") @ torch.ones(4, 5, device="tpu")


def test_unsupported_dtype():
    with pytest.raises(RuntimeError, match="not supported on tpu"):
        torch.zeros(2, dtype=torch.float8_e4m3fn).tpu()


def test_out_on_cpu_is_refused():
    a = torch.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match="on cpu"):
        torch.add(a, a, out=torch.empty(2))


def test_out_of_a_narrower_dtype_is_refused():
    a = torch.ones(2, device="tpu")
    out = torch.empty(2, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        torch.add(a, a, out=out)
