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


def _autoload() -> None:
    """The `torch.backends` entry point; importing rtpu did the work. Defined
    before torch is imported: `import rtpu` first makes torch autoload this
    very module while it is still initialising."""


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
        # As on TPUs with torch_xla and JAX: autocast means bfloat16.
        torch.set_autocast_dtype(_BACKEND, torch.bfloat16)
    if not hasattr(torch.Tensor, "is_" + _BACKEND):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )
    _print_through_host()
    if torch.distributed.is_available():
        from . import distributed

        distributed.register()
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


def metrics() -> dict:
    """rtpu's counters since the process started, by name (each declared
    once in the core, with its unit and help: see `metrics_report()`), and
    "cpu_fallbacks": the ops that ran on the CPU fallback with their counts."""
    names, _, _, values = torch.ops.rtpu.metrics()
    result = dict(zip(names, values))
    ops, counts = torch.ops.rtpu.fallback_counts()
    result["cpu_fallbacks"] = dict(zip(ops, counts))
    return result


def cache_info() -> dict:
    """The disk cache of compiled programs: its directory (None when off:
    `RTPU_CACHE_DIR=""`, or a directory not this user's own), how many
    entries and bytes it holds, and its cap (`RTPU_CACHE_MAX_BYTES`, default
    1 GiB; the entries used least recently go first)."""
    directory, entries, size, max_bytes = torch.ops.rtpu.cache_info()
    return {"dir": directory or None, "entries": entries, "bytes": size, "max_bytes": max_bytes}


def clear_cache() -> int:
    """Removes every entry of the disk cache; returns how many. Programs
    this process already loaded stay usable."""
    return torch.ops.rtpu.clear_cache()


def _format_metric(value: int, unit: str) -> str:
    if unit == "ns":
        return f"{value / 1e6:.1f} ms"
    if unit == "bytes":
        return f"{value} bytes"
    return str(value)


def metrics_report() -> str:
    """Every metric with its value and what it counts, then the CPU
    fallbacks by op, as readable text."""
    names, units, help, values = torch.ops.rtpu.metrics()
    width = max(map(len, names))
    lines = ["rtpu metrics"]
    for name, unit, line, value in zip(names, units, help, values):
        lines.append(f"  {name:<{width}}  {_format_metric(value, unit):>14}  {line}")
    fallbacks = dict(zip(*torch.ops.rtpu.fallback_counts()))
    lines.append(f"  {'cpu_fallbacks':<{width}}  {sum(fallbacks.values()):>14}  ops run on the CPU fallback")
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
