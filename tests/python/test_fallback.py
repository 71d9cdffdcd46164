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


def metric_deltas(run):
    """How much each counter of `rtpu.metrics()` moved over `run()`."""
    before = rtpu.metrics()
    run()
    after = rtpu.metrics()
    return {k: after[k] - before[k] for k in after if k != "cpu_fallbacks"}


def test_metrics_count_exactly_what_ran():
    n = 4099  # a size no other test uses, so its ops compile here
    x = torch.randn(n)
    values = {}

    def upload():
        values["t"] = x.to("tpu")

    def multiply():
        values["u"] = values["t"] * values["t"]

    def read():
        values["host"] = values["u"].cpu()

    def step():
        with rtpu.step():
            values["v"] = values["u"] * values["t"] + values["t"]

    d = metric_deltas(upload)
    assert (d["host_to_device_bytes"], d["device_to_host_bytes"], d["ops_run"]) == (4 * n, 0, 0), d
    assert d["live_buffers"] == 1, d
    d = metric_deltas(multiply)
    assert (d["ops_run"], d["executables_compiled"], d["cache_hits"], d["graph_executions"]) == (1, 1, 0, 0), d
    assert d["compile_ns"] > 0 and d["execute_ns"] > 0, d
    assert d["host_to_device_bytes"] == 0 and d["live_buffers"] == 1, d
    d = metric_deltas(multiply)  # the same op again: the cached executable
    assert (d["ops_run"], d["executables_compiled"], d["cache_hits"], d["compile_ns"]) == (1, 0, 1, 0), d
    assert d["execute_ns"] > 0, d
    d = metric_deltas(read)
    assert (d["device_to_host_bytes"], d["host_to_device_bytes"]) == (4 * n, 0), d
    assert d["wait_ns"] > 0, d
    torch.testing.assert_close(values["host"], x * x)
    d = metric_deltas(step)
    assert (d["ops_recorded"], d["ops_run"], d["graph_executions"], d["executables_compiled"]) == (2, 0, 1, 1), d
    assert d["record_ns"] > 0 and d["compile_ns"] > 0 and d["execute_ns"] > 0, d
    torch.testing.assert_close(values["v"].cpu(), x * x * x + x)
