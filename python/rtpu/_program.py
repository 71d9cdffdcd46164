"""How one graph AOTAutograd hands the `tpu` backend becomes a program:
run once through the same op lowering as eager and step mode, recorded as
one graph (a capture) and compiled into one executable; later calls with
the same input signature (shapes, dtypes, strides, scalar values) replay
it, binding the inputs' buffers to the executable in one call with no
per-op dispatch. Inputs the graph mutates (optimizer state, BatchNorm
statistics) take their new values in place.

Ops that only read CPU inputs (the step counts of a non-capturable
optimizer) run on the CPU every call; the values the device ops read from
them enter the executable as inputs. Graphs with dynamic sizes compile per
size bucket (see `_buckets`).

A graph that cannot be replayed (an op runs on the CPU fallback, it reads a
value on the host mid-graph, or it returns an input) runs its ops again on
every call, with a one-time warning that says why.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Optional

import torch

from rtpu import _buckets

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


class Pair:
    """What one Dynamo graph's forward and backward graphs share when they
    run in size buckets."""

    def __init__(self) -> None:
        # The padded layouts of the forward's values, by node name: the
        # backward's saved activations keep those names.
        self.known_dims: dict = {}
        self.backward: Optional[Program] = None
        # Saved activations the forward hands over padded, when the backward
        # is bucketed too: cutting and padding them again would cost a copy
        # and a program per size each.
        self.saved_padded: set[str] = set()


class Program:
    """One AOTAutograd graph (forward, backward or inference): a captured
    executable per input signature.

    A graph with dynamic sizes compiles per size bucket instead (see
    `_buckets`): its inputs are padded to the bucket, and its outputs cut
    back."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, pair: Pair) -> None:
        # Ops on CPU scalars (non-capturable optimizers' step counts) run on
        # the host every call; the device graph takes their results as inputs.
        self.host_part = _HostPart.split(gm)
        if self.host_part is not None:
            gm = self.host_part.device_gm
        self.gm = gm
        self.name = name
        self.pair = pair
        self.site = f"torch.compile {name} graph {id(self):#x}"
        self.captured: dict[tuple, Any] = {}
        self.warned = False
        self.size_tensors: dict[int, torch.Tensor] = {}
        self.dynamic = _has_dynamic_sizes(gm)
        self.plan: Optional[_buckets.Plan] = None
        self.planned = False
        # How many of a forward graph's outputs are the user's (the rest are
        # saved for the backward).
        self.user_outputs: Optional[int] = None
        if name == "backward":
            pair.backward = self
        context = torch._guards.TracingContext.try_get()
        if name == "forward" and context is not None and context.fw_metadata is not None:
            self.user_outputs = len(context.fw_metadata.tokens) + context.fw_metadata.num_forward

    def bucket_plan(self) -> Optional[_buckets.Plan]:
        """The graph's padding plan, made on its first call (the forward's
        first, so that the backward can use its layouts); None when its
        sizes are static or it cannot be padded."""
        if self.planned or not self.dynamic:
            return self.plan
        self.planned = True
        arrive_padded = self.pair.saved_padded if self.name == "backward" else set()
        try:
            self.plan = _buckets.Plan(self.gm, self.pair.known_dims, arrive_padded)
        except _buckets.NotBucketable as e:
            self._warn(f"it compiles once per size of its dynamic dims, since {e}", op_by_op=False)
            return None
        backward = self.pair.backward
        if self.name == "forward" and self.user_outputs is not None and backward is not None:
            if backward.bucket_plan() is not None:
                self.pair.saved_padded |= _buckets.padded_outputs(self.plan, self.user_outputs)
        return self.plan

    def __call__(self, *args: Any) -> Any:
        if self.host_part is not None:
            args = self.host_part(args)
        plan = self.bucket_plan()
        if plan is not None:
            sizes = _buckets.Sizes(plan, _buckets.true_sizes(plan, args), self._size_tensor)
            padded = _buckets.pad_inputs(plan, args, sizes)

            def run(*padded_args: Any) -> Any:
                # Only a capture (or an op-by-op graph) runs the ops: a
                # replay never builds the interpreter.
                return _buckets.Runner(self.gm, plan, sizes).run(*padded_args)

            outputs = self._run(padded, run, list(sizes.tensors.values()))
            keep = self.pair.saved_padded if self.name == "forward" else set()
            return _buckets.cut_outputs(plan, outputs, sizes, keep)
        return self._run(args, self.gm, [])

    def _run(self, args: Any, run: Callable, extra_inputs: list) -> Any:
        """Replays the executable for the signature of args (plus the extra
        device inputs), capturing it on first sight."""
        key = _signature(args)
        entry = self.captured.get(key)
        if entry is None:
            outputs, entry = self._capture(args, run, extra_inputs)
            self.captured[key] = entry
            return outputs
        graph, template = entry
        if graph is None:
            return run(*args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)] + extra_inputs
        replayed = iter(graph.replay(tensors))
        return [next(replayed) if slot is _REPLAYED else slot for slot in template]

    def _size_tensor(self, size: int) -> torch.Tensor:
        """A true size as a device input of the bucket's executable."""
        tensor = self.size_tensors.get(size)
        if tensor is None:
            tensor = self.size_tensors[size] = torch.tensor(size, device=_TPU)
        return tensor

    def _capture(self, args: tuple, run: Callable, extra_inputs: list) -> tuple[Any, Any]:
        # A new signature of a graph that captured before compiles at the
        # same site: the core counts it as a recompile, explains it and
        # applies the recompile limit.
        tensors = [a for a in args if isinstance(a, torch.Tensor)] + extra_inputs
        off_device = [i for i, t in enumerate(tensors) if t.device.type != _TPU]
        if off_device:
            self._warn(f"inputs {off_device} are not on tpu (their values would be baked in)")
            return run(*args), (None, None)
        fallbacks_before = torch.ops.rtpu.fallback_counts()
        torch.ops.rtpu.capture_begin(tensors)
        try:
            outputs = run(*args)
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

    def _warn(self, reason: str, op_by_op: bool = True) -> None:
        if not self.warned:
            self.warned = True
            how = "runs op by op" if op_by_op else "is not bucketed"
            warnings.warn(f"rtpu: the {self.name} graph compiled by torch.compile {how}: {reason}", stacklevel=3)


def _on_cpu(node: torch.fx.Node) -> bool:
    """Whether a node makes only CPU tensors (and at least one)."""
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    return bool(tensors) and len(tensors) == len(values) and all(t.device.type == "cpu" for t in tensors)


class _HostPart:
    """The ops of a graph that only read CPU inputs (an optimizer's step
    counts and bias corrections), split off to run eagerly on the CPU every
    call. Their results that device ops read enter the device graph as
    inputs, so it has no CPU inputs and can be captured and replayed; the
    CPU inputs they update are updated in place, as before."""

    def __init__(self, host_gm: torch.fx.GraphModule, device_gm: torch.fx.GraphModule, on_host: list[bool]) -> None:
        self.host_gm = host_gm
        self.device_gm = device_gm
        self.on_host = on_host

    @staticmethod
    def split(gm: torch.fx.GraphModule) -> Optional["_HostPart"]:
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        host = {p for p in placeholders if _on_cpu(p)}
        if not host:
            return None
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.all_input_nodes and all(a in host for a in node.all_input_nodes):
                if _on_cpu(node) or node.target is operator.getitem:
                    host.add(node)
        output = next(iter(gm.graph.find_nodes(op="output")))
        if any(a in host for a in output.all_input_nodes):
            return None  # the user sees a host value: keep the graph whole
        # Host values that device ops read: they cross over as inputs.
        crossing = [n for n in gm.graph.nodes if n in host and any(u not in host for u in n.users)]
        if not all(isinstance(n.meta.get("val"), torch.Tensor) for n in crossing):
            return None

        host_graph = torch.fx.Graph()
        host_env: dict = {}
        for node in gm.graph.nodes:
            if node in host or node.op == "placeholder":
                host_env[node] = host_graph.node_copy(node, lambda n: host_env[n])
        host_graph.output(tuple(host_env[n] for n in crossing))

        device_graph = torch.fx.Graph()
        device_env: dict = {}
        for node in placeholders:
            if node not in host:
                device_env[node] = device_graph.node_copy(node, lambda n: device_env[n])
        for node in crossing:
            device_env[node] = device_graph.placeholder(f"host_{node.name}")
            device_env[node].meta = dict(node.meta)
        for node in gm.graph.nodes:
            if node not in host and node.op != "placeholder":
                device_env[node] = device_graph.node_copy(node, lambda n: device_env[n])
        return _HostPart(
            torch.fx.GraphModule(gm, host_graph),
            torch.fx.GraphModule(gm, device_graph),
            [p in host for p in placeholders],
        )

    def __call__(self, args: tuple) -> list:
        """Runs the host part; returns the device graph's arguments."""
        crossing = self.host_gm(*args)
        device_args = [a for a, on_host in zip(args, self.on_host) if not on_host]
        return device_args + [value.to(_TPU, non_blocking=True) for value in crossing]


def _has_dynamic_sizes(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        sizes = value.shape if isinstance(value, torch.Tensor) else [value]
        if any(isinstance(s, torch.SymInt) for s in sizes):
            return True
    return False
