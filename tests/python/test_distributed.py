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
