"""`torch.tpu`: the device module, shaped like `torch.cuda`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from typing import Any

import torch

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "current_device",
    "default_generator",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_execution_mode",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "mem_get_info",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_execution_mode",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_ops = torch.ops.rtpu


def _index(device: Any = None) -> int:
    """A device index from None (the current device), an int, a string or a
    torch.device."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"expected a tpu device, got {device}")
    return current_device() if device.index is None else device.index


def is_available() -> bool:
    """Whether the plugin loads and has at least one device."""
    return device_count() > 0


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes `torch.autocast("tpu", dtype=...)` accepts: bfloat16, the
    TPU's own, and float16 (XLA runs it on every plugin)."""
    return [torch.bfloat16, torch.float16]


def is_initialized() -> bool:
    """Whether the runtime (the PJRT plugin and its client) has been opened."""
    return bool(_ops.is_initialized())


def device_count() -> int:
    """The number of tpu devices (0 when the plugin cannot be opened)."""
    return int(_ops.device_count())


def current_device() -> int:
    """The index of this thread's current tpu device."""
    return int(_ops.current_device())


def set_device(device: Any) -> None:
    """Makes `device` this thread's current tpu device."""
    _ops.set_device(_index(device))


class device:
    """Context manager that makes `device` current inside its block."""

    def __init__(self, device: Any):
        self.index = _index(device)
        self.previous = -1

    def __enter__(self):
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc: object) -> bool:
        set_device(self.previous)
        return False


def synchronize(device: Any = None) -> None:
    """Runs every pending (deferred) graph and waits for the device's work."""
    _ops.synchronize(_index(device))


@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    """What `get_device_properties` says of a device."""

    name: str
    """The device's kind, as the plugin names it ("TPU v5 lite", "cpu")."""
    platform: str
    """The plugin's platform ("tpu", "cpu", "cuda")."""
    description: str
    total_memory: int
    """Bytes; the host's memory on the CPU plugin, whose devices use it."""
    multi_processor_count: int
    """Cores (CUDA's name, which tools read): the plugin's `num_cores` (TPU
    cores of the chip); the host's CPUs on the CPU plugin, whose devices
    share them."""


def get_device_properties(device: Any = None) -> _DeviceProperties:
    index = _index(device)
    kind, description, cores = _ops.device_info(index)
    _, total = mem_get_info(index)
    if cores < 0:
        cores = os.cpu_count() or 1
    return _DeviceProperties(kind, _ops.platform_name(), description, total, cores)


def get_device_name(device: Any = None) -> str:
    """The device's kind, as the plugin names it ("TPU v5 lite", "cpu")."""
    return get_device_properties(device).name


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: XLA computes bfloat16 on every PJRT platform."""
    return True


# ----- streams and events ----------------------------------------------------
#
# A device runs its work in one queue, in the order rtpu launches it. Streams
# name that queue (each current per thread, as CUDA's), so a stream's work
# is always behind what any stream of the device launched before. An Event
# marks the work launched on its device before `record`: `query`,
# `synchronize` and `elapsed_time` (with enable_timing=True) act on it. Ops
# still pending in deferred mode (`rtpu.step()`) are launched when the step
# ends, so an event recorded inside a step does not cover them.


class Stream(torch.Stream):
    """A stream of a tpu device (the current one by default), as
    `torch.cuda.Stream`. The priority orders nothing: the device has one
    queue."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if kwargs:
            # An existing stream: stream_id, device_index, device_type.
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)


class _EventType(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_EventType):
    """A point in a tpu device's work, as `torch.cuda.Event`. Makes a
    `torch.Event` of the tpu device: `torch.Event.elapsed_time` takes no
    subclass of it, so tpu events are plain ones (and `isinstance(e,
    torch.tpu.Event)` says whether `e` is one)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def _as_tpu_stream(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


def current_stream(device: Any = None) -> Stream:
    """This thread's current stream of the device."""
    return _as_tpu_stream(torch.accelerator.current_stream(_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The device's default stream (id 0)."""
    current = torch.accelerator.current_stream(_index(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes `stream` this thread's current stream, and its device current."""
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes `stream` this thread's current stream (and its device current)
    inside the block, as `torch.cuda.StreamContext`; None changes nothing."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self._enter: contextlib.AbstractContextManager = contextlib.nullcontext()

    def __enter__(self) -> torch.Stream | None:
        # torch.Stream's own context saves and restores the stream and device.
        if self.stream is not None:
            self._enter = self.stream
        self._enter.__enter__()
        return self.stream

    def __exit__(self, *exc: object) -> None:
        self._enter.__exit__(*exc)


def stream(stream: torch.Stream | None) -> StreamContext:
    """`with torch.tpu.stream(s):` runs the block with `s` current."""
    return StreamContext(stream)


_MODES = ("eager", "deferred")


def set_execution_mode(mode: str) -> None:
    """"eager" (the default) runs each op as it is called; "deferred" records
    ops and runs them as one program at `rtpu.sync()`, at the end of an
    `rtpu.step()` block, or when a value is read on the host. Leaving
    deferred mode runs what is pending."""
    if mode not in _MODES:
        raise ValueError(f"execution mode must be one of {_MODES}, got {mode!r}")
    _ops.set_deferred(mode == "deferred")


def get_execution_mode() -> str:
    return "deferred" if _ops.is_deferred() else "eager"


# ----- random numbers ------------------------------------------------------


def default_generator(device: Any = None) -> torch.Generator:
    """The default generator of a tpu device."""
    return _ops.default_generator(_index(device))


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator, including ones not used yet."""
    seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    # The op takes int64: pass the uint64's bits.
    _ops.manual_seed_all(seed - (1 << 64) if seed >= 1 << 63 else seed)


def seed() -> int:
    """Seeds the current device's default generator randomly; returns it."""
    return default_generator().seed()


def seed_all() -> None:
    """Seeds every device's default generator with one random seed."""
    manual_seed_all(random.getrandbits(64))


def initial_seed() -> int:
    """The current device's default generator's seed."""
    return default_generator().initial_seed()


def get_rng_state(device: Any = "tpu") -> torch.Tensor:
    """The default generator's state (a CPU uint8 tensor)."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
    """Restores a state from `get_rng_state`."""
    default_generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def _is_in_bad_fork() -> bool:
    # torch.manual_seed asks before seeding custom devices.
    return False


# ----- memory ----------------------------------------------------------------


def memory_stats(device: Any = None) -> dict[str, Any]:
    return torch.accelerator.memory_stats(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device, as the plugin reports them; the
    host's memory on the CPU plugin, whose devices use it."""
    return torch.accelerator.get_memory_info(_index(device))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """`memory_stats` as a table: each statistic's current value, peak,
    and totals allocated and freed since start (`abbreviated` is accepted
    for torch.cuda's signature; the table is short already)."""
    stats = memory_stats(device)
    rows = [
        ("Allocated memory", "allocated_bytes.all", _format_bytes),
        ("Active memory", "active_bytes.all", _format_bytes),
        ("Requested memory", "requested_bytes.all", _format_bytes),
        ("Reserved memory", "reserved_bytes.all", _format_bytes),
        ("Allocations", "allocation.all", str),
        ("Active allocations", "active.all", str),
        ("Segments", "segment.all", str),
    ]
    header = f"{'tpu:' + str(_index(device)) + ' memory':<20}{'current':>12}{'peak':>12}{'allocated':>12}{'freed':>12}"
    lines = [header, "-" * len(header)]
    for title, key, fmt in rows:
        values = (stats.get(f"{key}.{field}", 0) for field in ("current", "peak", "allocated", "freed"))
        lines.append(f"{title:<20}" + "".join(f"{fmt(v):>12}" for v in values))
    lines.append(f"{'Device allocs/frees':<20}{stats.get('num_device_alloc', 0):>12}{stats.get('num_device_free', 0):>12}")
    return "\n".join(lines) + "\n"


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tpu storages on the device."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    """The peak of memory_allocated since start or reset_peak_memory_stats."""
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device: Any = None) -> int:
    """Equal to memory_allocated: storages keep no cache. (On the CPU plugin
    the process-wide cache of large freed host blocks is
    `rtpu.metrics()["host_cache_bytes"]`; see empty_cache.)"""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """Freed storages go back at once; this gives back the large host blocks
    the CPU plugin freed and rtpu kept for its next runs (README "Speed")."""
    torch.accelerator.empty_cache()
