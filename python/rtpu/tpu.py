"""`torch.tpu`: the device module, shaped like `torch.cuda`."""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = [
    "device",
    "device_count",
    "current_device",
    "default_generator",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_execution_mode",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_execution_mode",
    "set_rng_state",
    "set_rng_state_all",
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


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tpu storages on the device."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    """The peak of memory_allocated since start or reset_peak_memory_stats."""
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device: Any = None) -> int:
    """Equal to memory_allocated: rtpu keeps no cache."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """A no-op: rtpu keeps no cache, freed storages go back at once."""
    torch.accelerator.empty_cache()
