"""What each rank of a test in test_distributed.py runs, under torchrun:
`python -m torch.distributed.run --nproc-per-node 2 distributed_cases.py CASE`.
A case checks its own results (against gloo on CPU tensors, or a one-process
run) and exits non-zero with the failure on stderr; the seed of its random
inputs comes from RTPU_TEST_SEED, the same on every rank."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import rtpu

DEVICE = "tpu"
# The test's timeout is longer: a hang shows as this error, not as a kill.
TIMEOUT = datetime.timedelta(seconds=20)
SEED = int(os.environ["RTPU_TEST_SEED"])


def random(shape, dtype, rank):
    """Inputs that differ per rank, from the test's seed."""
    g = torch.Generator().manual_seed(SEED + 1000 * rank)
    if dtype == torch.int64:
        return torch.randint(-50, 50, shape, generator=g)
    return torch.randn(shape, generator=g).to(dtype)


def same(tpu_result, gloo_result, what):
    """gloo ran the same algorithm on the same bytes: the results are equal."""
    assert torch.equal(tpu_result.cpu(), gloo_result), f"{what}: {tpu_result.cpu()} != {gloo_result}"


def collectives_match_gloo():
    """Every collective on tpu tensors equals gloo on the same CPU tensors."""
    dist.init_process_group("tpu", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = random((3, 4), dtype, rank)
        for op in ops + ([dist.ReduceOp.AVG] if dtype.is_floating_point else []):
            t, c = x.to(DEVICE), x.clone()
            dist.all_reduce(t, op=op)
            if op == dist.ReduceOp.AVG:  # gloo has no AVG: its sum, divided
                dist.all_reduce(c, group=gloo)
                c /= world
            else:
                dist.all_reduce(c, op=op, group=gloo)
            same(t, c, f"all_reduce {op} {dtype}")
        t, c = [torch.empty_like(x, device=DEVICE) for _ in range(world)], [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(t, x.to(DEVICE))
        dist.all_gather(c, x, group=gloo)
        for i in range(world):
            same(t[i], c[i], f"all_gather {dtype}")
        t, c = torch.empty(world * 3, 4, dtype=dtype, device=DEVICE), torch.empty(world * 3, 4, dtype=dtype)
        dist.all_gather_into_tensor(t, x.to(DEVICE))
        dist.all_gather_into_tensor(c, x, group=gloo)
        same(t, c, f"all_gather_into_tensor {dtype}")
        big = random((world * 3, 4), dtype, rank)
        t, c = torch.empty(3, 4, dtype=dtype, device=DEVICE), torch.empty(3, 4, dtype=dtype)
        dist.reduce_scatter_tensor(t, big.to(DEVICE))
        dist.reduce_scatter_tensor(c, big, group=gloo)
        same(t, c, f"reduce_scatter_tensor {dtype}")
        t, c = torch.empty(world * 3, 4, dtype=dtype, device=DEVICE), torch.empty(world * 3, 4, dtype=dtype)
        dist.all_to_all_single(t, big.to(DEVICE))
        dist.all_to_all_single(c, big, group=gloo)
        same(t, c, f"all_to_all_single {dtype}")
        # Uneven splits: rank r sends r + 1 rows to each peer.
        rows = [rank + 1] * world
        received = [r + 1 for r in range(world)]
        source = random((sum(rows), 4), dtype, rank)
        t, c = torch.empty(sum(received), 4, dtype=dtype, device=DEVICE), torch.empty(sum(received), 4, dtype=dtype)
        dist.all_to_all_single(t, source.to(DEVICE), received, rows)
        dist.all_to_all_single(c, source, received, rows, group=gloo)
        same(t, c, f"all_to_all_single uneven {dtype}")
        t, c = x.to(DEVICE), x.clone()
        dist.broadcast(t, src=1)
        dist.broadcast(c, src=1, group=gloo)
        same(t, c, f"broadcast {dtype}")
        t, c = x.to(DEVICE), x.clone()
        dist.reduce(t, dst=0)
        dist.reduce(c, dst=0, group=gloo)
        if rank == 0:
            same(t, c, f"reduce {dtype}")
        gathered = [torch.empty_like(x, device=DEVICE) for _ in range(world)] if rank == 0 else None
        dist.gather(x.to(DEVICE), gathered, dst=0)
        if rank == 0:
            for i, g in enumerate(gathered):
                same(g, random((3, 4), dtype, i), f"gather {dtype}")
        pieces = [random((3, 4), dtype, 100 + i) for i in range(world)]
        t = torch.empty(3, 4, dtype=dtype, device=DEVICE)
        dist.scatter(t, [p.to(DEVICE) for p in pieces] if rank == 1 else None, src=1)
        same(t, pieces[rank], f"scatter {dtype}")
        if rank == 0:
            dist.send(x.to(DEVICE), dst=1)
        else:
            t = torch.empty(3, 4, dtype=dtype, device=DEVICE)
            dist.recv(t, src=0)
            same(t, random((3, 4), dtype, 0), f"send/recv {dtype}")
        # async_op: the result is there after wait().
        t, c = x.to(DEVICE), x.clone()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        dist.all_reduce(c, group=gloo)
        same(t, c, f"async all_reduce {dtype}")
        # The functional collectives (DTensor's and compiled code's).
        c = x.clone()
        dist.all_reduce(c, group=gloo)
        same(funcol.all_reduce(x.to(DEVICE), "sum", dist.group.WORLD), c, f"funcol all_reduce {dtype}")
        c = torch.empty(world * 3, 4, dtype=dtype)
        dist.all_gather_into_tensor(c, x, group=gloo)
        same(funcol.all_gather_tensor(x.to(DEVICE), 0, dist.group.WORLD), c, f"funcol all_gather {dtype}")
        c = torch.empty(3, 4, dtype=dtype)
        dist.reduce_scatter_tensor(c, big, group=gloo)
        same(funcol.reduce_scatter_tensor(big.to(DEVICE), "sum", 0, dist.group.WORLD), c, f"funcol reduce_scatter {dtype}")
    dist.barrier()
    dist.destroy_process_group()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def ddp_matches_one_process():
    """DDP over 2 ranks, each on half the batch, ends with the weights of
    one process training on the whole batch."""
    dist.init_process_group("tpu", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    # As with CUDA: the local rank picks the device.
    torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device(DEVICE, torch.tpu.current_device())
    torch.manual_seed(SEED)
    reference = mlp()
    model = mlp()
    model.load_state_dict(reference.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(device))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(SEED)
    for _ in range(5):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[mine].to(device)), y[mine].to(device)).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        reference_optimizer.step()
    # Measured: ≤ 3e-7 from float32 rounding of the halves' mean; margin 30x.
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5, msg=name)
    dist.destroy_process_group()


def dtensor_matches_plain_tensors():
    """DTensor on a tpu DeviceMesh: distribute, redistribute through Shard,
    Replicate and Partial, and a tensor-parallel pair of linears."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dist.init_process_group("tpu", timeout=TIMEOUT)
    world = dist.get_world_size()
    mesh = init_device_mesh(DEVICE, (world,))
    torch.manual_seed(SEED)
    full = torch.randn(4 * world, 6)
    d = distribute_tensor(full.to(DEVICE), mesh, [Shard(0)])
    torch.testing.assert_close(d.to_local().cpu(), full.chunk(world)[dist.get_rank()], rtol=0, atol=0)
    d = d.redistribute(mesh, [Replicate()])
    torch.testing.assert_close(d.to_local().cpu(), full, rtol=0, atol=0)
    # Partial: each rank holds a summand (its share of `full`); to Replicate
    # is an all-reduce, to Shard a reduce-scatter.
    share = (dist.get_rank() + 1) / sum(range(1, world + 1))
    partial = DTensor.from_local((full * share).to(DEVICE), mesh, [Partial()])
    torch.testing.assert_close(partial.redistribute(mesh, [Replicate()]).to_local().cpu(), full, rtol=1e-6, atol=1e-6)
    sharded = partial.redistribute(mesh, [Shard(0)]).to_local().cpu()
    torch.testing.assert_close(sharded, full.chunk(world)[dist.get_rank()], rtol=1e-6, atol=1e-6)

    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    parallel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    parallel.load_state_dict(plain.state_dict())
    parallelize_module(parallel.to(DEVICE), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(5, 8)
    want = plain(x)
    got = parallel(x.to(DEVICE))
    # Row-parallel sums partial products across ranks: float32 rounding.
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    want.sum().backward()
    grad = parallel[0].weight.grad.full_tensor().cpu()
    torch.testing.assert_close(grad, plain[0].weight.grad, rtol=1e-5, atol=1e-5)
    dist.destroy_process_group()


def fsdp2_matches_one_process():
    """FSDP2 (`fully_shard` per block and at the root) on the GPT, each rank
    on half the batch, ends with the weights of one process training on the
    whole batch; its losses average to that process's losses."""
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    from gpt import GPT

    dist.init_process_group("tpu", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    reference = GPT(64, 32, 2, 2, 16)
    model = GPT(64, 32, 2, 2, 16)
    model.load_state_dict(reference.state_dict())
    model.to(DEVICE)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    # SGD, not Adam: the key bias's gradient is rounding noise (attention
    # ignores it), which Adam would scale up to full-size steps.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(SEED)
    for _ in range(3):
        tokens = torch.randint(0, 64, (2 * world, 16), generator=g)
        mine = tokens[rank * 2 : (rank + 1) * 2].to(DEVICE)
        loss = F.cross_entropy(model(mine).flatten(0, 1), mine.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        F.cross_entropy(reference(tokens).flatten(0, 1), tokens.flatten()).backward()
        reference_optimizer.step()
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        # Float32 rounding of the halves' mean gradient over 3 steps.
        torch.testing.assert_close(got.full_tensor().cpu(), want, rtol=1e-4, atol=1e-5)
    dist.destroy_process_group()


def expect_error(kind, pattern, run):
    import re

    try:
        run()
    except kind as error:
        assert re.search(pattern, str(error)), f"{error!r} does not match {pattern!r}"
        return
    raise AssertionError(f"no {kind.__name__} matching {pattern!r}")


def bad_input_gives_errors_on_every_rank():
    """Shapes that differ across ranks, a CPU tensor on a tpu-only group
    (on one rank only): clear errors on every rank, and the group goes on."""
    dist.init_process_group("tpu", timeout=TIMEOUT)
    rank = dist.get_rank()
    x = torch.ones(4 + rank, device=DEVICE)
    expect_error(
        RuntimeError,
        r"disagree: rank 0 called #1 allreduce\(tpu:float32\[4\], SUM\); rank 1 called #1 allreduce\(tpu:float32\[5\], SUM\)",
        lambda: dist.all_reduce(x),
    )
    on_cpu = rank == 1
    y = torch.ones(3, device="cpu" if on_cpu else DEVICE)
    if on_cpu:
        expect_error(ValueError, r"tpu process group .* got a tensor on cpu; it takes tpu tensors", lambda: dist.all_reduce(y))
    else:
        expect_error(RuntimeError, r"rank 1 called #2 allreduce\(cpu:float32\[3\], SUM\) refused", lambda: dist.all_reduce(y))
    expect_error(ValueError, r"ReduceOp.AVG needs floating-point", lambda: dist.all_reduce(
        torch.ones(2, dtype=torch.int64, device=DEVICE), op=dist.ReduceOp.AVG))
    z = torch.ones(2, device=DEVICE)
    dist.all_reduce(z)  # nothing was sent for the refused calls: still in step
    assert z.cpu().tolist() == [2.0, 2.0]
    dist.destroy_process_group()


def cpu_tensors_on_a_mixed_group():
    """backend="cpu:gloo,tpu:tpu": CPU and tpu tensors both work."""
    dist.init_process_group("cpu:gloo,tpu:tpu", timeout=TIMEOUT)
    for device in ("cpu", DEVICE):
        t = torch.full((2,), float(dist.get_rank() + 1), device=device)
        dist.all_reduce(t)
        assert t.cpu().tolist() == [3.0, 3.0], (device, t)
    dist.destroy_process_group()


def subgroups_coalescing_steps_and_compiled_collectives():
    """A new_group subgroup, coalesced collectives, and collectives inside
    rtpu.step() and a torch.compile'd function equal gloo's results."""
    dist.init_process_group("tpu", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    x = random((4, 3), torch.float32, rank)
    expected = x.clone()
    dist.all_reduce(expected, group=gloo)

    pair = dist.new_group([0, 1], backend="tpu")
    t = x.to(DEVICE)
    dist.all_reduce(t, group=pair)
    same(t, expected, "all_reduce on a new_group")
    alone = dist.new_group([1], backend="tpu")
    if rank == 1:
        t = x.to(DEVICE)
        dist.all_reduce(t, group=alone)
        same(t, x, "all_reduce on a one-rank group")

    a, b = x.to(DEVICE), (x * 2).to(DEVICE)
    with dist._coalescing_manager(async_ops=True) as coalesced:
        dist.all_reduce(a)
        dist.all_reduce(b)
    coalesced.wait()
    same(a, expected, "coalesced all_reduce")
    same(b, expected * 2, "coalesced all_reduce")

    # In a step: the pending graph runs up to the collective, which then
    # reads its input; the ops after it record into the next graph.
    t = x.to(DEVICE)
    splits = rtpu.metrics()["collective_splits"]
    with rtpu.step():
        y = t * 2
        dist.all_reduce(y)
        z = y + 1
    same(z, expected * 2 + 1, "all_reduce inside rtpu.step()")
    assert rtpu.metrics()["collective_splits"] == splits + 1, "the step's program ends at the collective"

    def compiled_step(v):
        return funcol.all_reduce(v * 2, "sum", dist.group.WORLD) + 1

    compiled = torch.compile(compiled_step, backend="tpu")
    for _ in range(2):
        same(compiled(x.to(DEVICE)), expected * 2 + 1, "funcol all_reduce under torch.compile")
    dist.barrier()
    dist.destroy_process_group()


def a_rank_that_exits_gives_its_peer_an_error():
    dist.init_process_group("tpu", timeout=TIMEOUT)
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)  # gone without a word
    start = time.monotonic()
    expect_error(RuntimeError, r".", lambda: dist.all_reduce(torch.ones(2, device=DEVICE)))
    assert time.monotonic() - start < TIMEOUT.total_seconds() + 5


def exiting_without_destroying_the_group():
    """A script that never calls destroy_process_group exits cleanly: gloo's
    threads end before the interpreter does (they once aborted it while
    releasing a finished collective's host tensors)."""
    dist.init_process_group("tpu", timeout=TIMEOUT)
    for _ in range(20):
        t = torch.ones(4, device=DEVICE)
        dist.all_reduce(t)
    assert t.cpu().eq(dist.get_world_size()).all()


if __name__ == "__main__":
    globals()[sys.argv[1]]()
