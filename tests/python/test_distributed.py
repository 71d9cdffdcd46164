"""torch.distributed on tpu: the "tpu" c10d backend, in real processes at
world size 2 under torchrun. Each case (distributed_cases.py) checks its
results on every rank: collectives against gloo on the same CPU tensors,
DDP and FSDP2 against one process on the whole batch, DTensor against
plain tensors,
and bad input against the errors each rank must raise."""

import os
import subprocess
import sys

import pytest
import torch

CASES = os.path.join(os.path.dirname(__file__), "distributed_cases.py")


def run_ranks(case: str, timeout: int = 150) -> str:
    """Runs `case` on 2 ranks; fails with every rank's output unless all
    ranks exit 0 within `timeout` seconds."""
    seed = torch.seed() % 2**31
    print("seed", seed)
    env = dict(os.environ, RTPU_TEST_SEED=str(seed), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", CASES, case],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "case",
    [
        "collectives_match_gloo",
        "ddp_matches_one_process",
        "dtensor_matches_plain_tensors",
        "fsdp2_matches_one_process",
        "bad_input_gives_errors_on_every_rank",
        "cpu_tensors_on_a_mixed_group",
        "subgroups_coalescing_steps_and_compiled_collectives",
        "a_rank_that_exits_gives_its_peer_an_error",
        "exiting_without_destroying_the_group",
    ],
)
def test_two_ranks(case):
    run_ranks(case)


# ----- collectives over the devices of this process -------------------------

REDUCE = {
    "sum": lambda s: s.sum(0),
    "avg": lambda s: s.mean(0),
    "min": lambda s: s.amin(0),
    "max": lambda s: s.amax(0),
    "prod": lambda s: s.prod(0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_all_reduce_over_the_devices_of_this_process_matches_cpu(dtype):
    import rtpu.distributed

    devices = torch.tpu.device_count()
    for op, reduce in REDUCE.items():
        if op == "avg" and not dtype.is_floating_point:
            continue
        inputs = [torch.randint(-3, 4, (5, 3)).to(dtype) if not dtype.is_floating_point
                  else torch.randn(5, 3).to(dtype) for _ in range(devices)]
        tensors = [x.to(f"tpu:{d}") for d, x in enumerate(inputs)]
        rtpu.distributed.all_reduce_devices(tensors, op)
        want = reduce(torch.stack([x.double() for x in inputs])).to(dtype)
        # bf16: XLA adds in bf16 as it goes; CPU reduces in double, rounding once.
        tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
        for d, t in enumerate(tensors):
            assert t.device == torch.device(f"tpu:{d}")
            torch.testing.assert_close(t.cpu(), want, **tolerance, msg=f"{op} {dtype} on tpu:{d}")


def test_all_reduce_over_devices_of_a_non_contiguous_view_and_inside_a_step():
    import rtpu.distributed

    inputs = [torch.randn(4, 6) for _ in range(2)]
    tensors = [x.to(f"tpu:{d}").t() for d, x in enumerate(inputs)]
    splits = rtpu.metrics()["collective_splits"]
    with rtpu.step():
        doubled = [t * 2 for t in tensors]
        rtpu.distributed.all_reduce_devices(doubled)
        after = [t + 1 for t in doubled]
    want = (inputs[0] + inputs[1]).t() * 2 + 1
    for t in after:
        torch.testing.assert_close(t.cpu(), want, rtol=1e-6, atol=1e-6)
    assert rtpu.metrics()["collective_splits"] == splits + 1


def test_all_reduce_over_devices_refuses_bad_input_clearly():
    import rtpu.distributed

    a, b = torch.ones(3, device="tpu:0"), torch.ones(3, device="tpu:1")
    with pytest.raises(RuntimeError, match="each device once"):
        rtpu.distributed.all_reduce_devices([a, torch.ones(3, device="tpu:0")])
    with pytest.raises(RuntimeError, match="tensor 1 is on cpu"):
        rtpu.distributed.all_reduce_devices([a, torch.ones(3)])
    with pytest.raises(RuntimeError, match=r"one dtype and shape.*tensor 1 is Float\[4\]"):
        rtpu.distributed.all_reduce_devices([a, torch.ones(4, device="tpu:1")])
    with pytest.raises(RuntimeError, match="op must be sum, avg, min, max or prod, got 'mean'"):
        rtpu.distributed.all_reduce_devices([a, b], "mean")
    # Nothing was lost: the inputs are unchanged and usable.
    rtpu.distributed.all_reduce_devices([a, b])
    assert a.cpu().tolist() == b.cpu().tolist() == [2.0, 2.0, 2.0]
