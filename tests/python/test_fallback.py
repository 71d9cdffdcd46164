"""Ops the core lacks run on the CPU: once-per-op warning, counted, correct."""

import warnings

import pytest
import torch

import rtpu

# Ops the core is unlikely to implement soon, rarest first (the warning is
# once per process, so the test needs one nothing else has run yet), each by
# the name that reaches the fallback (logcumsumexp decomposes to
# _logcumsumexp; structured ops fall back as their .out overload).
CANDIDATES = [
    ("aten::_logcumsumexp", lambda t, dim: torch.logcumsumexp(t, dim)),
    ("aten::special_erfcx", lambda t, dim: torch.special.erfcx(t)),
    ("aten::cumprod", lambda t, dim: torch.cumprod(t, dim)),
    ("aten::cumsum", lambda t, dim: torch.cumsum(t, dim)),
]


def runs_natively(op: str) -> bool:
    overloads = [s.overload_name for s in torch._C._jit_get_schemas_for_operator(op)]
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"{op}.{o}" if o else op, "PrivateUse1")
        for o in overloads
    )


def fallback_count(op: str) -> int:
    counts = rtpu.metrics()["cpu_fallbacks"]
    return sum(n for name, n in counts.items() if name == op or name.startswith(op + "."))


def test_cpu_fallback_warns_once_counts_and_is_right():
    candidates = [(op, fn) for op, fn in CANDIDATES if not runs_natively(op)]
    assert candidates, "every candidate now runs natively: add an op the core does not implement"
    op, fn = candidates[0]
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4
    before = fallback_count(op)
    with pytest.warns(UserWarning, match=rf"{op}.*runs on the CPU"):
        first = fn(x.tpu(), 0)
    assert first.device.type == "tpu"
    torch.testing.assert_close(first.cpu(), fn(x, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = fn(x.tpu(), 1)
    assert not [w for w in caught if op in str(w.message)]
    torch.testing.assert_close(second.cpu(), fn(x, 1))
    assert fallback_count(op) == before + 2


def test_metrics_shape():
    torch.ones(2, device="tpu").add_(1)
    m = rtpu.metrics()
    for key in ("ops_run", "executables_compiled", "cache_hits", "host_to_device_bytes", "device_to_host_bytes"):
        assert isinstance(m[key], int) and m[key] >= 0
    assert m["ops_run"] >= 1
    assert isinstance(m["cpu_fallbacks"], dict)
