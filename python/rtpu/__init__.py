"""rtpu: PyTorch on TPUs, and on any other PJRT device, through a Rust core.

Importing rtpu (or just `import torch`, through the `torch.backends` entry
point) registers the `tpu` device: `torch.ones(2, device="tpu")`,
`tensor.tpu()`, `torch.tpu.*`. The work is done by the C++ library in
`lib/`, whose static initialisers register everything with PyTorch.
"""

from __future__ import annotations

import os
import sys

from . import _plugin

_plugin.configure()

import torch  # noqa: E402  (the plugin must be chosen before torch loads us)

__all__ = ["debug", "metrics", "metrics_report", "set_recompile_limit", "step", "sync"]

_LIBRARY = os.path.join(os.path.dirname(__file__), "lib", "librtpu_torch.so")
_BACKEND = "tpu"


def _initialize() -> None:
    # Idempotent: every step checks whether it already happened, so importing
    # rtpu after autoload (or reloading it) is harmless.
    if not hasattr(torch.ops.rtpu, "engine_metrics"):
        if not os.path.isfile(_LIBRARY):
            raise ImportError(f"rtpu: {_LIBRARY} is missing; build it with scripts/build-shim")
        torch.ops.load_library(_LIBRARY)
    if torch._C._get_privateuse1_backend_name() != _BACKEND:
        torch.utils.rename_privateuse1_backend(_BACKEND)
    if not hasattr(torch, _BACKEND):
        from . import tpu

        torch._register_device_module(_BACKEND, tpu)
    if not hasattr(torch.Tensor, "is_" + _BACKEND):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )
    _print_through_host()
    # A recorded op is attributed to the innermost frame outside these
    # (FX's generated code included: its caller is the user's line).
    torch.ops.rtpu.set_internal_paths(
        [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep, "<eval_with_key>"]
    )


def _print_through_host() -> None:
    """Formatting a tensor runs element-wise ops on slices of it (is each
    value an integer? how wide?). PyTorch copies xla and lazy tensors to the
    CPU first so printing compiles nothing; tpu tensors get the same."""
    from torch import _tensor_str

    format_values = _tensor_str._tensor_str
    if getattr(format_values, "_rtpu", False):
        return

    def tensor_str(self: torch.Tensor, indent: int) -> str:
        return format_values(self.cpu() if self.device.type == _BACKEND else self, indent)

    tensor_str._rtpu = True
    _tensor_str._tensor_str = tensor_str


_initialize()


def _autoload() -> None:
    """The `torch.backends` entry point; importing rtpu did the work."""


# The fields of torch.ops.rtpu.engine_metrics(), in order.
_ENGINE_METRICS = (
    "ops_run",
    "ops_recorded",
    "executables_compiled",
    "cache_hits",
    "disk_cache_hits",
    "graph_executions",
    "recompiles",
    "record_ns",
    "compile_ns",
    "execute_ns",
    "wait_ns",
    "host_to_device_bytes",
    "device_to_host_bytes",
    "live_buffers",
    "buffers_donated",
)


def metrics() -> dict:
    """Engine counters since the process started: ops run eagerly and
    recorded into deferred graphs, executables compiled, cache hits (memory
    and disk), graph executions, recompiles, time (ns) spent recording,
    compiling, launching and waiting, host<->device bytes, live device
    buffers, buffers donated to graphs, and the ops that ran on the CPU
    fallback with their counts."""
    ops, counts = torch.ops.rtpu.fallback_counts()
    result = dict(zip(_ENGINE_METRICS, torch.ops.rtpu.engine_metrics()))
    result["cpu_fallbacks"] = dict(zip(ops, counts))
    return result


def metrics_report() -> str:
    """`metrics()` as readable text."""
    m = metrics()
    ms = lambda ns: f"{ns / 1e6:.1f} ms"  # noqa: E731
    per_op = m["record_ns"] / m["ops_recorded"] / 1e3 if m["ops_recorded"] else 0.0
    lines = [
        "rtpu metrics",
        f"  ops run eagerly        {m['ops_run']}",
        f"  ops recorded           {m['ops_recorded']} ({per_op:.2f} us/op)",
        f"  graphs executed        {m['graph_executions']}",
        f"  executables compiled   {m['executables_compiled']}",
        f"  recompiles             {m['recompiles']}",
        f"  cache hits             {m['cache_hits']} memory, {m['disk_cache_hits']} disk",
        f"  time recording         {ms(m['record_ns'])}",
        f"  time compiling         {ms(m['compile_ns'])}",
        f"  time launching         {ms(m['execute_ns'])}",
        f"  time waiting on device {ms(m['wait_ns'])}",
        f"  host->device           {m['host_to_device_bytes']} bytes",
        f"  device->host           {m['device_to_host_bytes']} bytes",
        f"  live device buffers    {m['live_buffers']}",
        f"  buffers donated        {m['buffers_donated']}",
    ]
    fallbacks = m["cpu_fallbacks"]
    lines.append(f"  CPU fallbacks          {sum(fallbacks.values())}")
    for op, count in sorted(fallbacks.items(), key=lambda item: -item[1]):
        lines.append(f"    {op:<30} {count}")
    return "\n".join(lines)


def _caller_line(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def sync() -> None:
    """Runs everything recorded so far (deferred mode) as one program, without
    waiting for the device; recompiles are explained per calling line."""
    torch.ops.rtpu.flush(_caller_line(1))


class step:
    """`with rtpu.step(): ...` records the block's ops (forward, backward,
    optimizer) and runs them as one XLA program when the block ends; the
    next step is recorded while the device runs this one. Values read on
    the host inside the block (`.item()`, `.cpu()`, printing) run what is
    pending first."""

    def __init__(self) -> None:
        self._site = _caller_line(1)
        self._was_deferred = False

    def __enter__(self) -> "step":
        self._was_deferred = torch.ops.rtpu.is_deferred()
        torch.ops.rtpu.set_deferred(True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            torch.ops.rtpu.flush(self._site)
        except Exception:
            if exc is None:
                raise
            # The block's own exception is the one to see.
        finally:
            if not self._was_deferred:
                torch.ops.rtpu.set_deferred(False)


def set_recompile_limit(limit: int | None) -> None:
    """After `limit` recompiles at one step site (the `rtpu.step()` or
    `rtpu.sync()` line), the next raises with an explanation of what changed;
    None removes the limit."""
    torch.ops.rtpu.set_recompile_limit(-1 if limit is None else int(limit))


from . import debug  # noqa: E402
