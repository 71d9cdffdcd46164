"""The `torch.compile` backend "tpu".

Dynamo hands over an FX graph; AOTAutograd splits it into functional
forward and backward graphs of ATen ops. Each of those runs once through
the same op lowering as eager and step mode, recorded as one graph (a
capture), and is compiled into one executable. Later calls with the same
input signature (shapes, dtypes, strides, scalar values) replay it: the
inputs' buffers are bound to the executable in one call, with no per-op
dispatch. Inputs the graph mutates (optimizer state, BatchNorm statistics)
take their new values in place.

A graph that cannot be replayed (its inputs include CPU tensors, an op runs
on the CPU fallback, it reads a value on the host mid-graph, or it returns an
input) runs its ops again on every call, with a one-time warning that says
why.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

_TPU = "tpu"
# Marks an output position the replay fills with a tensor.
_REPLAYED = object()


def _signature(args: tuple) -> tuple:
    """What a captured graph is specialised on: each tensor's device, dtype,
    shape, strides, offset and storage size; every other argument's value."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append(
                (
                    a.device,
                    a.dtype,
                    tuple(a.shape),
                    tuple(a.stride()),
                    a.storage_offset(),
                    a.untyped_storage().nbytes(),
                )
            )
        else:
            key.append((type(a), a))
    return tuple(key)


class _Graph:
    """One AOTAutograd graph (forward, backward or inference): a captured
    executable per input signature."""

    def __init__(self, gm: torch.fx.GraphModule, name: str) -> None:
        self.gm = gm
        self.name = name
        self.site = f"torch.compile {name} graph {id(self):#x}"
        self.captured: dict[tuple, Any] = {}
        self.warned = False

    def __call__(self, *args: Any) -> Any:
        key = _signature(args)
        entry = self.captured.get(key)
        if entry is None:
            outputs, entry = self._capture(args)
            self.captured[key] = entry
            return outputs
        graph, template = entry
        if graph is None:
            return self.gm(*args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        replayed = iter(graph.replay(tensors))
        return [next(replayed) if slot is _REPLAYED else slot for slot in template]

    def _capture(self, args: tuple) -> tuple[Any, Any]:
        # A new signature of a graph that captured before compiles at the
        # same site: the core counts it as a recompile, explains it and
        # applies the recompile limit.
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        off_device = [i for i, t in enumerate(tensors) if t.device.type != _TPU]
        if off_device:
            self._warn(f"inputs {off_device} are not on tpu (their values would be baked in)")
            return self.gm(*args), (None, None)
        fallbacks_before = torch.ops.rtpu.fallback_counts()
        torch.ops.rtpu.capture_begin(tensors)
        try:
            outputs = self.gm(*args)
        except BaseException:
            torch.ops.rtpu.capture_end([], self.site)
            raise
        listed = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        returned = [o for o in listed if isinstance(o, torch.Tensor) and o.device.type == _TPU]
        graph = torch.ops.rtpu.capture_end(returned, self.site)
        reason = graph.reason() if not graph.replayable() else None
        if reason is None and torch.ops.rtpu.fallback_counts() != fallbacks_before:
            reason = "an op ran on the CPU fallback"
        if reason is None and len(returned) != sum(isinstance(o, torch.Tensor) for o in listed):
            reason = "it returns tensors that are not on tpu"
        if reason is not None:
            self._warn(reason)
            return outputs, (None, None)
        # Non-tensor outputs (sizes, absent gradients) depend only on the
        # signature.
        template = [_REPLAYED if isinstance(o, torch.Tensor) else o for o in listed]
        return outputs, (graph, template)

    def _warn(self, reason: str) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"rtpu: the {self.name} graph compiled by torch.compile runs op by op: {reason}",
                stacklevel=3,
            )


def _compiler(name: str) -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from functorch.compile import make_boxed_func

        return make_boxed_func(_Graph(gm, name))

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The `tpu` backend of `torch.compile`."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        # Mutations stay in inference graphs (optimizer steps), where they
        # become in-place writes of the inputs' storages.
        keep_inference_input_mutations=True,
    )(gm, example_inputs, **kwargs)
