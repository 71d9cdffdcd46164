"""Chooses the PJRT plugin: $RTPU_PLUGIN wins; else $PJRT_DEVICE (CPU, TPU or
CUDA) names an installed plugin package; else a TPU when libtpu is installed
and a TPU is attached, the CPU plugin otherwise."""

from __future__ import annotations

import glob
import importlib.util
import os
import warnings

# kind -> (module, library file, how to install it)
PLUGINS = {
    "CPU": ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so", "pip install xla-cpu-pjrt"),
    "TPU": ("libtpu", "libtpu.so", "pip install libtpu"),
    "CUDA": ("jax_plugins.xla_cuda13", "xla_cuda_plugin.so", "pip install jax-cuda13-pjrt"),
}


def plugin_path(kind: str) -> str | None:
    """The installed plugin library for `kind`, or None."""
    module, library, _ = PLUGINS[kind]
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        path = os.path.join(directory, library)
        if os.path.isfile(path):
            return path
    return None


def _tpu_attached() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def resolve() -> str | None:
    """The plugin path rtpu will use, or None when none is available."""
    explicit = os.environ.get("RTPU_PLUGIN")
    if explicit:
        return explicit
    requested = os.environ.get("PJRT_DEVICE")
    if requested:
        kind = requested.upper()
        if kind not in PLUGINS:
            warnings.warn(
                f"rtpu: PJRT_DEVICE={requested} is not one of {', '.join(PLUGINS)}; ignoring it",
                stacklevel=3,
            )
        else:
            path = plugin_path(kind)
            if path is None:
                warnings.warn(
                    f"rtpu: PJRT_DEVICE={requested} but its plugin is not installed "
                    f"({PLUGINS[kind][2]})",
                    stacklevel=3,
                )
            return path
    if _tpu_attached():
        path = plugin_path("TPU")
        if path is not None:
            return path
    return plugin_path("CPU")


def configure() -> None:
    """Sets $RTPU_PLUGIN, which the runtime reads when it first opens."""
    if not os.environ.get("RTPU_PLUGIN"):
        path = resolve()
        if path is not None:
            os.environ["RTPU_PLUGIN"] = path
