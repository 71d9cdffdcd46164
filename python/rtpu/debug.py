"""Debugging aids."""

from __future__ import annotations

import torch

__all__ = ["explain_recompiles"]


def explain_recompiles(on: bool = True) -> None:
    """Prints, for every recompile at a step site, what differs from the
    nearest graph compiled there (input shapes and dtypes, ops) and the lines
    that recorded them; the same as `RTPU_DEBUG=recompile`."""
    torch.ops.rtpu.set_explain_recompiles(bool(on))
