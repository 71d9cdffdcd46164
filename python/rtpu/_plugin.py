"""Chooses the PJRT plugin: $RTPU_PLUGIN wins; else $PJRT_DEVICE (CPU, TPU or
CUDA) names an installed plugin package; else a TPU when libtpu is installed
and a TPU is attached, the CPU plugin otherwise. Also caps the ISA of the
default CPU plugin where its float32 dots run slowly (see `xla_flags_for`)."""

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


# xla-cpu-pjrt 0.0.1 on a CPU with AVX512_BF16 runs float32 dots about half
# as fast as with XLA's ISA capped just below that feature: on an AMD EPYC
# (Zen 4), a 128x1024 @ 1024x1024 matmul took 6.3 ms of CPU time instead of
# 2-3, the MLP step 7-17% more and the GPT step 3-7% more in A/B pairs, and
# bfloat16 dots took the same either way. Newer plugins (and jaxlib's XLA)
# run those dots fast uncapped. A host with AMX is left alone: the cap would
# take AMX's bfloat16 dots from XLA, which was not measured.
DOT_ISA_CAP = "--xla_cpu_max_isa=AVX512_VNNI"

# What XLA_FLAGS held before `configure` (None when unset).
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS")


def user_environment() -> dict[str, str]:
    """This process's environment with XLA_FLAGS as the user gave it: what
    another XLA in a child process (a benchmark's JAX) should see."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if USER_XLA_FLAGS is not None:
        env["XLA_FLAGS"] = USER_XLA_FLAGS
    return env


def cpu_flags() -> set[str]:
    """The host CPU's feature flags, as /proc/cpuinfo names them (none
    where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def xla_flags_for(plugin: str, xla_flags: str, host_flags: set[str]) -> str:
    """XLA_FLAGS for running `plugin`: `xla_flags` plus `DOT_ISA_CAP` for the
    default CPU plugin on an AVX512_BF16 host without AMX, unless they choose
    an ISA (`RTPU_CPU_ISA_CAP=0` keeps them as they are)."""
    default_cpu_plugin = os.path.basename(plugin) == PLUGINS["CPU"][1]
    slow_dots = "avx512_bf16" in host_flags and "amx_tile" not in host_flags
    if not default_cpu_plugin or not slow_dots or "xla_cpu_max_isa" in xla_flags:
        return xla_flags
    return f"{xla_flags} {DOT_ISA_CAP}".strip()


def configure() -> None:
    """Sets $RTPU_PLUGIN, which the runtime reads when it first opens, and
    the XLA_FLAGS the plugin reads when it first compiles."""
    if not os.environ.get("RTPU_PLUGIN"):
        path = resolve()
        if path is not None:
            os.environ["RTPU_PLUGIN"] = path
    plugin = os.environ.get("RTPU_PLUGIN")
    if plugin and os.environ.get("RTPU_CPU_ISA_CAP") != "0":
        flags = xla_flags_for(plugin, USER_XLA_FLAGS or "", cpu_flags())
        if flags != (USER_XLA_FLAGS or ""):
            os.environ["XLA_FLAGS"] = flags
