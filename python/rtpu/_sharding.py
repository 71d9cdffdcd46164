"""SPMD sharding: a `tpu` tensor split over the devices of a mesh.

`mark_sharding(t, mesh, spec)` splits `t`'s storage in place over `mesh`,
one tile per device as `spec` names mesh axes per dim (torch_xla's
`xs.mark_sharding`, JAX's `PartitionSpec`). Programs that read a sharded
tensor, in `rtpu.step()` and eager alike, run as one SPMD program over the
mesh: XLA's partitioner inserts the collectives, parameters the step
overwrites keep their layout, and new values (gradients, optimizer state)
keep the layout XLA chose. `.cpu()`, printing and `torch.save` gather. `distribute_tensor` takes
DTensor's placements (`Shard(d)`, `Replicate()`) over a `Mesh` or a
one-process `DeviceMesh("tpu", ...)` to the same layouts.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional, Sequence, Tuple, Union

import torch

# One entry per dim: None (not split), an axis name, or several axis names
# (split over their product, the first outermost).
SpecEntry = Union[None, str, Tuple[str, ...]]


class Mesh:
    """Devices laid out on named axes.

    `Mesh((2, 2), ("data", "model"))` puts `tpu:0..3` on a 2x2 grid, row
    major; `device_ids` picks other devices (in that order).
    """

    def __init__(
        self,
        mesh_shape: Sequence[int],
        axis_names: Sequence[str],
        device_ids: Optional[Sequence[int]] = None,
    ):
        self.shape = tuple(int(s) for s in mesh_shape)
        self.axis_names = tuple(axis_names)
        size = math.prod(self.shape)
        if len(self.axis_names) != len(self.shape):
            raise ValueError(
                f"rtpu Mesh: one axis name per mesh dim: shape {self.shape}, names {self.axis_names}"
            )
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"rtpu Mesh: axis names must differ, got {self.axis_names}")
        if any(s < 1 for s in self.shape):
            raise ValueError(f"rtpu Mesh: every mesh dim must be >= 1, got {self.shape}")
        ids = list(range(size)) if device_ids is None else [int(d) for d in device_ids]
        if len(ids) != size or len(set(ids)) != size:
            raise ValueError(
                f"rtpu Mesh: {size} distinct device ids for shape {self.shape}, got {ids}"
            )
        available = torch.tpu.device_count()
        if any(d < 0 or d >= available for d in ids):
            raise ValueError(
                f"rtpu Mesh: device ids {ids} need {max(ids) + 1} tpu devices; this process has "
                f"{available} (on the CPU plugin, RTPU_CPU_DEVICES=N sets how many)"
            )
        self.device_ids = tuple(ids)

    @staticmethod
    def from_device_mesh(device_mesh) -> "Mesh":
        """The mesh of a `torch.distributed.device_mesh.DeviceMesh` over tpu
        devices (its dims named "dim0", ... when it names none)."""
        if device_mesh.device_type != "tpu":
            raise ValueError(f"rtpu Mesh: a DeviceMesh over tpu devices, got one over {device_mesh.device_type}")
        ids = device_mesh.mesh
        names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(ids.dim()))
        return Mesh(tuple(ids.shape), names, ids.flatten().tolist())

    @property
    def size(self) -> int:
        return len(self.device_ids)

    def axis_size(self, name: str) -> int:
        return self.shape[self.axis_names.index(name)]

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))
        return f"Mesh({axes}; devices {list(self.device_ids)})"


@dataclasses.dataclass(frozen=True)
class Sharding:
    """How a tensor's storage is split: along each of `dims`, `tiles` equal
    tiles, each held by `replicas` of the mesh `devices`; `partitions` lists
    the position (in `devices`) holding each (tile, copy), row major."""

    devices: Tuple[int, ...]
    dims: Tuple[int, ...]
    tiles: Tuple[int, ...]
    replicas: int
    partitions: Tuple[int, ...]

    def spec(self, mesh: Mesh) -> Optional[Tuple[SpecEntry, ...]]:
        """The spec over `mesh` that lays a tensor out like this, if one does."""
        if self.devices != mesh.device_ids:
            return None
        for spec in _candidate_specs(mesh, self.tiles):
            try:
                tiles, replicas, partitions = _layout(mesh, spec, self.dims, "")
            except ValueError:
                continue
            if (tiles, replicas, partitions) == (self.tiles, self.replicas, self.partitions):
                return spec
        return None


def _candidate_specs(mesh: Mesh, tiles: Tuple[int, ...]):
    """Every spec giving each mesh axis to at most one dim and cutting dim
    d into `tiles[d]` tiles (so only specs that can match are tried)."""

    def entries(free, count):
        if count == 1:
            yield None
        for length in range(1, len(free) + 1):
            for axes in itertools.permutations(free, length):
                if math.prod(mesh.axis_size(a) for a in axes) == count:
                    yield axes[0] if length == 1 else axes

    def extend(prefix, free):
        if len(prefix) == len(tiles):
            yield tuple(prefix)
            return
        for entry in entries(free, tiles[len(prefix)]):
            used = _axes(entry)
            yield from extend([*prefix, entry], [a for a in free if a not in used])

    yield from extend([], list(mesh.axis_names))


def _axes(entry: SpecEntry) -> Tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def _layout(mesh: Mesh, spec, dims, what: str):
    """(tiles, replicas, partitions) of a tensor of `dims` laid out by `spec`."""
    spec = tuple(spec)
    if len(spec) > len(dims):
        raise ValueError(
            f"rtpu mark_sharding: {what}: the spec {spec} has {len(spec)} entries for a tensor "
            f"of rank {len(dims)} (shape {list(dims)})"
        )
    spec = spec + (None,) * (len(dims) - len(spec))
    used = []
    for entry in spec:
        for axis in _axes(entry):
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"rtpu mark_sharding: {what}: the spec {spec} names axis {axis!r}, which "
                    f"the mesh {mesh.axis_names} does not have"
                )
            if axis in used:
                raise ValueError(
                    f"rtpu mark_sharding: {what}: the spec {spec} uses axis {axis!r} twice"
                )
            used.append(axis)
    tiles = []
    for d, (size, entry) in enumerate(zip(dims, spec)):
        count = math.prod(mesh.axis_size(a) for a in _axes(entry))
        if size % count:
            raise ValueError(
                f"rtpu mark_sharding: {what}: the spec {spec} splits dim {d} of size {size} "
                f"into {count} tiles; it must divide evenly"
            )
        tiles.append(count)
    # The mesh's positions with the split axes first, in spec order, then
    # the rest (the copies), read row major: the partition of each (tile, copy).
    rest = [a for a in mesh.axis_names if a not in used]
    order = [mesh.axis_names.index(a) for a in used + rest]
    positions = torch.arange(mesh.size).reshape(mesh.shape).permute(order).reshape(-1)
    replicas = math.prod(mesh.axis_size(a) for a in rest)
    return tuple(tiles), replicas, tuple(positions.tolist())


def mark_sharding(tensor: torch.Tensor, mesh: Mesh, spec: Sequence[SpecEntry]) -> torch.Tensor:
    """Splits `tensor` (a `tpu` tensor that is its whole storage, such as a
    parameter or a freshly moved batch) over `mesh` in place: dim `d` into
    tiles over the mesh axes `spec[d]` names (None: not split; a missing
    trailing entry: None). Returns `tensor`."""
    what = f"a tensor of shape {list(tensor.shape)}"
    if tensor.device.type != "tpu":
        raise ValueError(f"rtpu mark_sharding: {what} is on {tensor.device}, not a tpu device")
    whole = (
        tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )
    if not whole:
        raise ValueError(
            f"rtpu mark_sharding: {what} is a view of part of its storage; shard the tensor "
            "it views, or a clone()"
        )
    if tensor.device.index not in mesh.device_ids:
        raise ValueError(
            f"rtpu mark_sharding: {what} is on {tensor.device}, outside the mesh {mesh}"
        )
    tiles, replicas, partitions = _layout(mesh, spec, tuple(tensor.shape), what)
    data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    torch.ops.rtpu.shard_storage(
        data, list(mesh.device_ids), list(tensor.shape), list(tiles), replicas, list(partitions)
    )
    return tensor


def get_sharding(tensor: torch.Tensor) -> Optional[Sharding]:
    """How `tensor`'s storage is split over a mesh; None when it lives on one device."""
    if tensor.device.type != "tpu":
        return None
    data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    sharded, devices, dims, tiles, replicas, partitions = torch.ops.rtpu.storage_sharding(data)
    if not sharded:
        return None
    return Sharding(tuple(devices), tuple(dims), tuple(tiles), replicas, tuple(partitions))


def distribute_tensor(tensor: torch.Tensor, mesh, placements) -> torch.Tensor:
    """Lays `tensor` out over `mesh` (a `Mesh` or a one-process tpu
    `DeviceMesh`) as DTensor's `placements` say, one per mesh dim:
    `Shard(d)` splits tensor dim d over that mesh dim, `Replicate()` copies
    it. The tensor stays a plain `tpu` tensor, split in place as
    `mark_sharding` splits it (each op on it one SPMD program); returns it."""
    from torch.distributed.tensor.placement_types import Replicate, Shard

    if not isinstance(mesh, Mesh):
        mesh = Mesh.from_device_mesh(mesh)
    placements = tuple(placements)
    if len(placements) != len(mesh.axis_names):
        raise ValueError(
            f"rtpu distribute_tensor: one placement per mesh dim of {mesh}, got {placements}"
        )
    spec = [[] for _ in range(tensor.dim())]
    for axis, placement in zip(mesh.axis_names, placements):
        if isinstance(placement, Shard):
            if not -tensor.dim() <= placement.dim < tensor.dim():
                raise ValueError(
                    f"rtpu distribute_tensor: {placement} of a tensor of shape {list(tensor.shape)}"
                )
            spec[placement.dim % tensor.dim()].append(axis)
        elif not isinstance(placement, Replicate):
            raise ValueError(
                f"rtpu distribute_tensor: {placement} is not supported (Shard and Replicate are)"
            )
    entries = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in spec]
    return mark_sharding(tensor, mesh, entries)
