"""torch.distributed on `tpu`: the c10d backend named "tpu".

`init_process_group("tpu")` (or `"cpu:gloo,tpu:tpu"`, or no backend name at
all with `tpu` tensors) under `torchrun` gives a process group whose
collectives take `tpu` tensors; DDP, FSDP2 (`fully_shard`), DTensor and
`init_device_mesh("tpu", ...)` run on top of it unchanged.

No XLA CPU plugin runs a collective across processes, so each collective
stages its `tpu` tensors through host memory over gloo, created on the same
store: the bytes cross processes by PyTorch's own transport, never by a
protocol of ours. Before any byte moves, the ranks agree on what they are
doing (the collective, its sequence number, dtypes and shapes): a rank that
disagrees gets a clear error on every rank instead of a hang or garbage.
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    PrefixStore,
    ProcessGroup,
    ProcessGroupGloo,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _create_work_from_future,
)

from rtpu._sharding import Mesh, Sharding, distribute_tensor, get_sharding, mark_sharding

__all__ = [
    "Mesh",
    "ProcessGroupTpu",
    "Sharding",
    "all_reduce_devices",
    "distribute_tensor",
    "get_sharding",
    "mark_sharding",
]

BACKEND = "tpu"

# What each rank says it is doing, padded to this many bytes for the
# agreement exchange (longer descriptions are cut; their hash still decides).
_DESCRIPTION_BYTES = 256


def _is_tpu(tensor: torch.Tensor) -> bool:
    return tensor.device.type == BACKEND


def _describe(tensors, shapes: bool = True) -> str:
    return ", ".join(
        f"{t.device.type}:{str(t.dtype).removeprefix('torch.')}{list(t.shape) if shapes else ''}"
        for t in tensors
    )


def _done(result) -> dist.Work:
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _read_record(record: torch.Tensor) -> str:
    """'#sequence collective(what)' from an agreement record."""
    sequence = int.from_bytes(bytes(record[:8].tolist()), "little")
    text = bytes(record[16:].tolist()).rstrip(b"\0").decode(errors="replace")
    return f"#{sequence} {text}"


def _host_options(opts, divide_by: int):
    """`opts` for gloo, which has no AVG: an average is a sum, divided by the
    group size afterwards. Returns the options and the divisor (1 for none)."""
    if getattr(opts, "reduceOp", None) != ReduceOp.AVG:
        return opts, 1
    host = type(opts)()
    for field in ("timeout", "rootRank", "rootTensor", "asyncOp"):
        if hasattr(opts, field):
            setattr(host, field, getattr(opts, field))
    host.reduceOp = ReduceOp.SUM
    return host, divide_by


class _Staged:
    """Host copies of `tpu` tensors for a gloo call, and the copy back of
    the ones the collective writes."""

    def __init__(self, divide_by: int = 1):
        # Inside rtpu.step() the program ends here: the collective reads its
        # inputs on the host (counted as a `collective_splits`).
        torch.ops.rtpu.split_at_collective()
        self._divide_by = divide_by
        self._written: list[tuple[torch.Tensor, torch.Tensor]] = []

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        """The host tensor gloo reads in place of `tensor`."""
        return tensor.detach().to("cpu") if _is_tpu(tensor) else tensor

    def write(self, tensor: torch.Tensor) -> torch.Tensor:
        """The host tensor gloo writes; copied into `tensor` when done."""
        host = self.read(tensor)
        self._written.append((tensor, host))
        return host

    def finish(self, work: dist.Work, result) -> dist.Work:
        """Waits for gloo, then copies the results back (so `wait()` on the
        returned work, and the DDP hooks' futures, see them)."""
        work.wait()
        with torch.no_grad():
            for tensor, host in self._written:
                if self._divide_by != 1:
                    host.div_(self._divide_by)
                if _is_tpu(tensor):
                    tensor.copy_(host)
        return _done(result)


class ProcessGroupTpu(ProcessGroup):
    """A process group whose collectives take `tpu` tensors (and, when the
    group was made with `"cpu:gloo,tpu:tpu"`, CPU tensors too)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._gloo: ProcessGroupGloo | None = ProcessGroupGloo(PrefixStore("rtpu-host/", store), rank, size, timeout)
        _live_groups.add(self)
        self._sequence = 0
        self._accepts_cpu: bool | None = None
        self._group_name = self._group_desc = ""

    def getBackendName(self) -> str:
        return BACKEND

    @property
    def _host(self) -> ProcessGroupGloo:
        if self._gloo is None:
            raise RuntimeError(f"rtpu: process group {self.getGroupName()!r} was destroyed")
        return self._gloo

    def shutdown(self) -> None:
        """Ends gloo's threads now (destroy_process_group calls this, and so
        does interpreter exit). A gloo thread drops its last reference to a
        finished collective's host tensors a moment after `wait()` returns;
        if that happens while Python finalizes, it cannot take the GIL and
        the process aborts. Dropping the gloo group here runs its destructor
        (without the GIL), which drains its work and joins its threads."""
        self._gloo = None

    # The base class keeps a group's name and description in its backends,
    # and a Python group has none: they live here.
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    # ----- checks ---------------------------------------------------------

    def _problem(self, tensors, opts) -> str | None:
        """Why this rank cannot take part with these tensors, if it cannot."""
        for tensor in tensors:
            if not _is_tpu(tensor):
                if self._accepts_cpu is None:
                    self._accepts_cpu = "cpu:" in dist.get_backend_config(self)
                if tensor.device.type != "cpu" or not self._accepts_cpu:
                    return (
                        f"the tpu process group {self.getGroupName()!r} got a tensor on {tensor.device}; "
                        'it takes tpu tensors (make the group with backend="cpu:gloo,tpu:tpu" '
                        "to pass CPU tensors too)"
                    )
            if getattr(opts, "reduceOp", None) == ReduceOp.AVG and not tensor.is_floating_point():
                return f"ReduceOp.AVG needs floating-point tensors, got {tensor.dtype}"
        return None

    def _agree(self, collective: str, tensors, opts=None, detail: str = "", shapes: bool = True) -> None:
        """Every rank is at the same collective (by sequence number) with the
        same devices, dtypes and shapes; otherwise each rank raises, naming
        what each rank called, before any payload moves (gloo would hang or
        mix bytes). A rank that cannot take part says so in its record, so
        its peers raise too instead of waiting for it."""
        self._sequence += 1
        problem = self._problem(tensors, opts)
        if getattr(opts, "reduceOp", None) is not None:
            detail = ", ".join(filter(None, [opts.reduceOp.op.name, detail]))
        mine = f"{collective}({', '.join(filter(None, [_describe(tensors, shapes), detail]))})"
        if problem is not None:
            mine += f" refused: {problem}"
        digest = hashlib.sha256(mine.encode()).digest()
        record = torch.zeros(8 + 8 + _DESCRIPTION_BYTES, dtype=torch.uint8)
        record[:8] = torch.frombuffer(bytearray(self._sequence.to_bytes(8, "little")), dtype=torch.uint8)
        record[8:16] = torch.frombuffer(bytearray(digest[:8]), dtype=torch.uint8)
        text = mine.encode()[:_DESCRIPTION_BYTES]
        record[16 : 16 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        records = [torch.empty_like(record) for _ in range(self.size())]
        self._host.allgather([records], [record]).wait()
        if problem is not None:
            raise ValueError(f"rtpu: {problem}")
        if all(torch.equal(r[:16], record[:16]) for r in records):
            return
        said = "; ".join(f"rank {rank} called {_read_record(r)}" for rank, r in enumerate(records))
        raise RuntimeError(f"rtpu: the ranks of process group {self.getGroupName()!r} disagree: {said}")

    # ----- collectives ----------------------------------------------------

    def allreduce(self, tensors, opts=AllreduceOptions()):
        return self._reduce_staged("allreduce", self._host.allreduce, tensors, opts)

    def allreduce_coalesced(self, tensors, opts=AllreduceCoalescedOptions()):
        return self._reduce_staged("allreduce_coalesced", self._host.allreduce_coalesced, tensors, opts)

    def _reduce_staged(self, name, host_collective, tensors, opts):
        """gloo's `host_collective` on host copies of `tensors`, written back
        (and averaged, for AVG) when it finishes."""
        self._agree(name, tensors, opts)
        opts, divide_by = _host_options(opts, self.size())
        staged = _Staged(divide_by)
        host = [staged.write(t) for t in tensors]
        return staged.finish(host_collective(host, opts), tensors)

    def broadcast(self, tensors, opts=BroadcastOptions()):
        self._agree("broadcast", tensors, opts, f"root {opts.rootRank}")
        staged = _Staged()
        host = [staged.write(t) for t in tensors]
        return staged.finish(self._host.broadcast(host, opts), tensors)

    def reduce(self, tensors, opts=ReduceOptions()):
        self._agree("reduce", tensors, opts, f"root {opts.rootRank}")
        opts, divide_by = _host_options(opts, self.size())
        staged = _Staged(divide_by)
        host = [staged.write(t) for t in tensors]
        return staged.finish(self._host.reduce(host, opts), tensors)

    def allgather(self, output_lists, inputs, opts=AllgatherOptions()):
        self._agree("allgather", [t for ts in output_lists for t in ts] + inputs)
        staged = _Staged()
        host_outputs = [[staged.write(t) for t in outputs] for outputs in output_lists]
        host_inputs = [staged.read(t) for t in inputs]
        return staged.finish(self._host.allgather(host_outputs, host_inputs, opts), output_lists)

    def _allgather_base(self, output, input, opts=AllgatherOptions()):
        self._agree("allgather_into_tensor", [output, input])
        staged = _Staged()
        host_output, host_input = staged.write(output), staged.read(input)
        return staged.finish(self._host._allgather_base(host_output, host_input, opts), output)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=AllgatherOptions()):
        self._agree("allgather_into_tensor_coalesced", outputs + inputs)
        staged = _Staged()
        # gloo has no coalesced form: one base call per pair.
        for output, input in zip(outputs, inputs):
            self._host._allgather_base(staged.write(output), staged.read(input), opts).wait()
        return staged.finish(_done(None), outputs)

    def reduce_scatter(self, outputs, input_lists, opts=ReduceScatterOptions()):
        self._agree("reduce_scatter", outputs + [t for ts in input_lists for t in ts], opts)
        opts, divide_by = _host_options(opts, self.size())
        staged = _Staged(divide_by)
        host_outputs = [staged.write(t) for t in outputs]
        host_inputs = [[staged.read(t) for t in inputs] for inputs in input_lists]
        return staged.finish(self._host.reduce_scatter(host_outputs, host_inputs, opts), outputs)

    def _reduce_scatter_base(self, output, input, opts=ReduceScatterOptions()):
        self._agree("reduce_scatter_tensor", [output, input], opts)
        opts, divide_by = _host_options(opts, self.size())
        staged = _Staged(divide_by)
        host_output, host_input = staged.write(output), staged.read(input)
        return staged.finish(self._host._reduce_scatter_base(host_output, host_input, opts), output)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=ReduceScatterOptions()):
        self._agree("reduce_scatter_tensor_coalesced", outputs + inputs, opts)
        opts, divide_by = _host_options(opts, self.size())
        staged = _Staged(divide_by)
        for output, input in zip(outputs, inputs):
            self._host._reduce_scatter_base(staged.write(output), staged.read(input), opts).wait()
        return staged.finish(_done(None), outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=AllToAllOptions()):
        # Split sizes legitimately differ between ranks: only dtypes agree.
        self._agree("alltoall_base", [output, input], shapes=False)
        staged = _Staged()
        host_output, host_input = staged.write(output), staged.read(input)
        work = self._host.alltoall_base(host_output, host_input, output_split_sizes, input_split_sizes, opts)
        return staged.finish(work, output)

    def alltoall(self, outputs, inputs, opts=AllToAllOptions()):
        self._agree("alltoall", outputs + inputs, shapes=False)
        staged = _Staged()
        host_outputs = [staged.write(t) for t in outputs]
        host_inputs = [staged.read(t) for t in inputs]
        return staged.finish(self._host.alltoall(host_outputs, host_inputs, opts), outputs)

    def gather(self, output_lists, inputs, opts=GatherOptions()):
        self._agree("gather", inputs, opts, f"root {opts.rootRank}")
        staged = _Staged()
        host_outputs = [[staged.write(t) for t in outputs] for outputs in output_lists]
        host_inputs = [staged.read(t) for t in inputs]
        return staged.finish(self._host.gather(host_outputs, host_inputs, opts), output_lists)

    def scatter(self, outputs, input_lists, opts=ScatterOptions()):
        self._agree("scatter", outputs, opts, f"root {opts.rootRank}")
        staged = _Staged()
        host_outputs = [staged.write(t) for t in outputs]
        host_inputs = [[staged.read(t) for t in inputs] for inputs in input_lists]
        return staged.finish(self._host.scatter(host_outputs, host_inputs, opts), outputs)

    def barrier(self, opts=BarrierOptions()):
        self._agree("barrier", [])
        torch.ops.rtpu.split_at_collective()
        torch.tpu.synchronize()
        return _done(None)

    # Point-to-point calls pair two ranks, so there is nothing for the whole
    # group to agree on.
    def _check_alone(self, tensors) -> None:
        problem = self._problem(tensors, None)
        if problem is not None:
            raise ValueError(f"rtpu: {problem}")

    def send(self, tensors, dst, tag=0):
        self._check_alone(tensors)
        staged = _Staged()
        host = [staged.read(t) for t in tensors]
        return staged.finish(self._host.send(host, dst, tag), tensors)

    def recv(self, tensors, src, tag=0):
        self._check_alone(tensors)
        staged = _Staged()
        host = [staged.write(t) for t in tensors]
        return staged.finish(self._host.recv(host, src, tag), tensors)


def all_reduce_devices(tensors, op: str = "sum") -> None:
    """All-reduces `tensors` in place: one per tpu device of this process,
    of one dtype and shape, as `torch.cuda.nccl.all_reduce` does over GPUs.
    It runs as one XLA program with a replica per device, without host
    copies; `op` is "sum", "avg", "min", "max" or "prod". Inside
    `rtpu.step()` the step's program ends here (a `collective_splits`)."""
    tensors = list(tensors)
    results = torch.ops.rtpu.all_reduce_devices(tensors, op)
    with torch.no_grad():
        for tensor, result in zip(tensors, results):
            tensor.copy_(result)


# Groups whose gloo threads must end before the interpreter does.
_live_groups: weakref.WeakSet[ProcessGroupTpu] = weakref.WeakSet()


@atexit.register
def _shutdown_live_groups() -> None:
    for group in list(_live_groups):
        group.shutdown()


def _create(store, rank, size, timeout):
    return ProcessGroupTpu(store, rank, size, timeout)


def register() -> None:
    """Makes "tpu" a c10d backend name and the default one for `tpu`
    tensors (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=[BACKEND])
