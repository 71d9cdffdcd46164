"""rtpu: PyTorch on TPUs, and on any other PJRT device, through a Rust core.

Importing rtpu (or just `import torch`, through the `torch.backends` entry
point) registers the `tpu` device: `torch.ones(2, device="tpu")`,
`tensor.tpu()`, `torch.tpu.*`. The work is done by the C++ library in
`lib/`, whose static initialisers register everything with PyTorch.
"""

from __future__ import annotations

import os

from . import _plugin

_plugin.configure()

import torch  # noqa: E402  (the plugin must be chosen before torch loads us)

__all__ = ["metrics"]

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


_initialize()


def _autoload() -> None:
    """The `torch.backends` entry point; importing rtpu did the work."""


def metrics() -> dict:
    """Engine counters since the process started, and the ops that ran on
    the CPU fallback with their call counts."""
    ops, counts = torch.ops.rtpu.fallback_counts()
    engine = torch.ops.rtpu.engine_metrics()
    names = (
        "ops_run",
        "executables_compiled",
        "cache_hits",
        "host_to_device_bytes",
        "device_to_host_bytes",
    )
    result = dict(zip(names, engine))
    result["cpu_fallbacks"] = dict(zip(ops, counts))
    return result
