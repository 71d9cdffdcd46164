"""SPMD: tensors split over a mesh of this process's devices with
`rtpu.distributed.mark_sharding`, run as one program partitioned over the
mesh. Losses match one device's, layouts survive steps and checkpoints, and
bad specs are clear errors naming the tensor and the spec."""

import io
import math
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import rtpu
from rtpu.distributed import Mesh, distribute_tensor, get_sharding, mark_sharding
from conftest import assert_matches_cpu
from test_models import small_gpt, token_batches, train

DEVICE = "tpu"


@pytest.fixture(autouse=True)
def four_devices():
    assert torch.tpu.device_count() >= 4, "the CPU plugin gives each process 4 devices"


def gathered(t):
    return t.detach().cpu()


@pytest.mark.parametrize(
    "shape, spec",
    [
        ((8, 6), ("data", None)),
        ((8, 6), (None, "model")),
        ((8, 6), ("data", "model")),
        ((8, 6), (("data", "model"), None)),
        ((4, 6, 2), (None, "model")),
        ((5,), ()),
    ],
)
def test_a_sharded_tensor_reads_back_whole_and_says_its_layout(shape, spec):
    mesh = Mesh((2, 2), ("data", "model"))
    x = torch.randn(shape)
    t = x.to(DEVICE)
    assert get_sharding(t) is None
    assert mark_sharding(t, mesh, spec) is t
    sharding = get_sharding(t)
    assert sharding is not None and sharding.devices == (0, 1, 2, 3)
    assert sharding.spec(mesh) == tuple(spec) + (None,) * (len(shape) - len(spec))
    torch.testing.assert_close(t.cpu(), x, rtol=0, atol=0)
    assert str(t.cpu()) == str(x)
    # A host write keeps the layout (load_state_dict copies into parameters).
    y = torch.randn(shape)
    t.copy_(y)
    assert get_sharding(t) == sharding
    torch.testing.assert_close(t.cpu(), y, rtol=0, atol=0)


def test_eager_ops_on_sharded_tensors_run_partitioned_and_match_cpu():
    mesh = Mesh((4,), ("data",))
    x, w, b = torch.randn(8, 16), torch.randn(16, 12), torch.randn(12)
    xt, wt, bt = x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    mark_sharding(xt, mesh, ("data", None))
    before = rtpu.metrics()["spmd_executions"]
    y = torch.tanh(xt @ wt + bt)
    assert_matches_cpu(y, torch.tanh(x @ w + b))
    assert_matches_cpu(y.sum(dim=0), torch.tanh(x @ w + b).sum(dim=0))
    assert_matches_cpu(xt.max(), x.max())
    assert rtpu.metrics()["spmd_executions"] > before
    assert get_sharding(y) is not None  # the result stays on the mesh


def train_gpt(seed, layout=None, steps=6, mode="step"):
    """Losses of the small GPT trained with AdamW, and the model."""
    adamw = lambda ps: torch.optim.AdamW(ps, lr=3e-3)  # noqa: E731
    return train(DEVICE, small_gpt, adamw, token_batches(seed), steps, seed, mode, layout)


class Layout:
    """How a run splits its batches (over the mesh's "data" axis) and its
    parameters (`spec(name, parameter)`: a spec, or None to leave it whole)."""

    def __init__(self, mesh, spec=lambda name, p: None):
        self.mesh, self.spec = mesh, spec

    def model(self, model):
        for name, p in model.named_parameters():
            spec = self.spec(name, p)
            if spec is not None:
                mark_sharding(p, self.mesh, spec)

    def batch(self, x, y):
        mark_sharding(x, self.mesh, ("data",))
        mark_sharding(y, self.mesh, ("data",))


def data_parallel(mesh):
    return Layout(mesh)


def fsdp(mesh):
    return Layout(mesh, lambda name, p: ("data",) if p.shape[0] % mesh.size == 0 else None)


# Megatron-style: the MLP's first linear split on its outputs, the second
# on its inputs.
MEGATRON = {"mlp.0.weight": ("model", None), "mlp.0.bias": ("model",), "mlp.2.weight": (None, "model")}


def data_and_model(mesh):
    return Layout(mesh, lambda name, p: MEGATRON.get(name.split(".", 2)[-1]))


# Measured over 3 seeds per layout: sharded losses within 1.3e-7 relative
# of one device's (partitioned sums add in another order). 2e-5, as
# test_integration's loss tolerance, for seeds whose rounding is unluckier.
LOSS_RTOL = 2e-5


@pytest.mark.parametrize(
    "layout, mesh_shape, axes",
    [
        (data_parallel, (4,), ("data",)),
        (fsdp, (4,), ("data",)),
        (data_and_model, (2, 2), ("data", "model")),
    ],
)
def test_the_gpt_trains_as_one_spmd_program_with_one_devices_losses(layout, mesh_shape, axes):
    seed = torch.seed() % 2**31
    print(f"seed {seed}")  # shown on failure, to replay it
    expected, _ = train_gpt(seed)
    mesh = Mesh(mesh_shape, axes)
    before = rtpu.metrics()
    losses, model = train_gpt(seed, layout(mesh))
    after = rtpu.metrics()
    torch.testing.assert_close(losses, expected, rtol=LOSS_RTOL, atol=0)
    assert after["spmd_executions"] - before["spmd_executions"] >= 6
    # The partitioner put collectives in the program (gradient reductions
    # at the least).
    assert after["spmd_collectives"] > before["spmd_collectives"]
    # Parameters keep the layout they were given across steps.
    fresh = small_gpt().to(DEVICE)
    layout(mesh).model(fresh)
    split = [name for name, q in fresh.named_parameters() if get_sharding(q) is not None]
    assert bool(split) == (layout is not data_parallel)
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert get_sharding(q) is None or get_sharding(p) == get_sharding(q), name


def test_optimizer_state_follows_its_parameters_split():
    mesh = Mesh((4,), ("data",))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(DEVICE)
    mark_sharding(model.weight, mesh, ("data", None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        with rtpu.step():
            optimizer.zero_grad()
            model(torch.randn(4, 16).to(DEVICE)).square().sum().backward()
            optimizer.step()
    weight = get_sharding(model.weight)
    assert weight.tiles == (4, 1) and weight.replicas == 1
    for name in ("exp_avg", "exp_avg_sq"):
        state = get_sharding(optimizer.state[model.weight][name])
        # Split four ways as the weight is (XLA lays the flat state out as 4 row blocks).
        assert state is not None and state.replicas == 1 and math.prod(state.tiles) == 4, name


def test_dtensor_placements_lay_tensors_out_as_mark_sharding_does():
    from torch.distributed.tensor import Replicate, Shard

    mesh = Mesh((2, 2), ("data", "model"))
    x = torch.randn(8, 6)
    a, b = x.to(DEVICE), x.to(DEVICE)
    distribute_tensor(a, mesh, [Shard(0), Shard(1)])
    mark_sharding(b, mesh, ("data", "model"))
    assert get_sharding(a) == get_sharding(b)
    c = x.to(DEVICE)
    distribute_tensor(c, mesh, [Shard(0), Shard(0)])
    assert get_sharding(c).spec(mesh) == (("data", "model"), None)
    d = x.to(DEVICE)
    distribute_tensor(d, mesh, [Replicate(), Shard(1)])
    assert get_sharding(d).spec(mesh) == (None, "model")
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
    with pytest.raises(ValueError, match="one placement per mesh dim"):
        distribute_tensor(x.to(DEVICE), mesh, [Shard(0)])


def test_a_one_process_device_mesh_takes_dtensor_placements():
    # A DeviceMesh needs a default process group: in a process of its own.
    script = textwrap.dedent(
        """
        import os, torch, rtpu
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Replicate, Shard
        from rtpu.distributed import distribute_tensor, get_sharding
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        mesh = DeviceMesh("tpu", torch.arange(4).view(2, 2), mesh_dim_names=("dp", "tp"), _init_backend=False)
        x = torch.randn(8, 6)
        t = distribute_tensor(x.to("tpu"), mesh, [Shard(0), Replicate()])
        sharding = get_sharding(t)
        assert sharding.tiles == (2, 1) and sharding.replicas == 2, sharding
        assert torch.equal(t.cpu(), x)
        dist.destroy_process_group()
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_the_gpt_trains_eagerly_on_sharded_tensors_with_one_devices_losses():
    # Each op its own SPMD program: the script with mark_sharding lines and
    # no rtpu.step() trains the same network.
    seed = torch.seed() % 2**31
    print(f"seed {seed}")  # shown on failure, to replay it
    expected, _ = train_gpt(seed, steps=3, mode="eager")
    losses, _ = train_gpt(seed, data_and_model(Mesh((2, 2), ("data", "model"))), steps=3, mode="eager")
    torch.testing.assert_close(losses, expected, rtol=LOSS_RTOL, atol=0)


def test_a_sharded_models_state_dict_saves_gathered_and_loads_back_sharded():
    mesh = Mesh((4,), ("data",))
    seed = torch.seed() % 2**31
    _, model = train_gpt(seed, fsdp(mesh), steps=2)
    state = model.state_dict()
    buffer = io.BytesIO()
    torch.save({k: v.cpu() for k, v in state.items()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    for name, tensor in state.items():
        torch.testing.assert_close(loaded[name], gathered(tensor), rtol=0, atol=0)
    # Saved from tpu tensors directly too.
    direct = io.BytesIO()
    torch.save(state, direct)
    direct.seek(0)
    for name, tensor in torch.load(direct, map_location="cpu").items():
        torch.testing.assert_close(tensor, gathered(state[name]), rtol=0, atol=0)
    # Loading into a freshly sharded model keeps its layout.
    fresh = small_gpt().to(DEVICE)
    fsdp(mesh).model(fresh)
    layouts = {name: get_sharding(p) for name, p in fresh.named_parameters()}
    fresh.load_state_dict(loaded)
    for name, p in fresh.named_parameters():
        assert get_sharding(p) == layouts[name], name
        torch.testing.assert_close(gathered(p), loaded[name], rtol=0, atol=0)


@pytest.mark.parametrize(
    "shape, spec, message",
    [
        ((8, 4), ("batch", None), r"shape \[8, 4\].*names axis 'batch'.*does not have"),
        ((8,), ("data", None), r"shape \[8\].*2 entries for a tensor of rank 1"),
        ((6, 4), ("data", None), r"shape \[6, 4\].*splits dim 0 of size 6 into 4 tiles"),
        ((8, 8), ("data", "data"), r"shape \[8, 8\].*uses axis 'data' twice"),
    ],
)
def test_bad_specs_are_clear_errors_naming_the_tensor_and_the_spec(shape, spec, message):
    mesh = Mesh((4,), ("data",))
    x = torch.randn(shape)
    t = x.to(DEVICE)
    with pytest.raises(ValueError, match=message):
        mark_sharding(t, mesh, spec)
    assert get_sharding(t) is None
    torch.testing.assert_close(t.cpu(), x, rtol=0, atol=0)


def test_bad_meshes_and_views_are_clear_errors():
    with pytest.raises(ValueError, match="one axis name per mesh dim"):
        Mesh((2, 2), ("data",))
    with pytest.raises(ValueError, match="need 65 tpu devices"):
        Mesh((65,), ("data",))
    mesh = Mesh((4,), ("data",))
    t = torch.randn(8, 4).to(DEVICE)
    with pytest.raises(ValueError, match="a view of part of its storage"):
        mark_sharding(t[2:], mesh, ("data",))
    with pytest.raises(ValueError, match="not a tpu device"):
        mark_sharding(torch.randn(8), mesh, ("data",))


def test_torch_compile_over_sharded_inputs_runs_each_graph_as_one_spmd_program():
    mesh = Mesh((4,), ("data",))
    seed = torch.seed() % 2**31
    print(f"seed {seed}")  # shown on failure, to replay it

    def run(layout):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(DEVICE)
        if layout is not None:
            layout.model(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_of = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="tpu")
        g = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(4):
            x, y = torch.randn(8, 16, generator=g).to(DEVICE), torch.randint(0, 4, (8,), generator=g).to(DEVICE)
            if layout is not None:
                layout.batch(x, y)
            optimizer.zero_grad()
            before = rtpu.metrics()
            loss = loss_of(x, y)
            forward.append({k: rtpu.metrics()[k] - before[k] for k in ("ops_recorded", "spmd_executions")})
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    forward = []
    expected = run(None)
    forward.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs op by op" fallback
        losses = run(fsdp(mesh))
    torch.testing.assert_close(losses, expected, rtol=LOSS_RTOL, atol=0)
    # Once captured, each call of the compiled forward is one graph,
    # recorded whole and run as one SPMD program.
    assert forward[-1] == {"ops_recorded": 1, "spmd_executions": 1}, forward
