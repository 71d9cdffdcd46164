"""Collectives on `tpu` next to gloo on the same CPU tensors, in one run:
all-reduce bandwidth from 1 MB to 256 MB over 2 processes (the tpu backend
stages through host memory over gloo, so gloo is the floor) and over 2 and
4 devices of one process (`rtpu.distributed.all_reduce_devices`: one XLA
program, no host copies), and a DDP step on 2 processes next to 1. A
benchmark, not a test: numbers vary by machine.

    python benches/bench_collectives.py [--max-mb 256] [--repeats 5]
"""

import argparse
import datetime
import os
import subprocess
import sys

import torch
import torch.distributed as dist

from timing import median_seconds


def all_reduce_rows(max_mb, repeats):
    rows = []
    gloo = dist.new_group(backend="gloo")
    mb = 1
    while mb <= max_mb:
        n = mb * 2**20 // 4
        cpu = torch.ones(n)
        tpu = torch.ones(n, device="tpu")
        torch.tpu.synchronize()
        t_gloo = median_seconds(lambda: dist.all_reduce(cpu, group=gloo), repeats, warmup=1)

        def on_tpu():
            dist.all_reduce(tpu)
            torch.tpu.synchronize()

        t_tpu = median_seconds(on_tpu, repeats, warmup=1)
        # Rank 0 alone, over devices of its own process (rank 1 waits in
        # its next all_reduce meanwhile).
        in_process = [in_process_time(n, devices, repeats) if dist.get_rank() == 0 else 0.0 for devices in (2, 4)]
        rows.append((mb, t_gloo, t_tpu, *in_process))
        mb *= 4
    return rows


def in_process_time(n, devices, repeats):
    import rtpu.distributed

    tensors = [torch.ones(n, device=f"tpu:{d}") for d in range(devices)]
    torch.tpu.synchronize()

    def run():
        rtpu.distributed.all_reduce_devices(tensors)
        torch.tpu.synchronize()

    return median_seconds(run, repeats, warmup=1)


def ddp_step_time(repeats, world):
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to("tpu")
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128 // world, 784, device="tpu")
    y = torch.randint(0, 10, (128 // world,), device="tpu")

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        torch.tpu.synchronize()

    return median_seconds(step, repeats, warmup=1)


def worker(args):
    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=600))
    rows = all_reduce_rows(args.max_mb, args.repeats)
    ddp = ddp_step_time(args.repeats, dist.get_world_size())
    if dist.get_rank() == 0:
        print("all_reduce, float32, median seconds: gloo and tpu over 2 processes (tpu stages through")
        print("host memory over gloo); tpu over 2 and 4 devices of one process (one XLA program)")
        print(f"{'MB':>6} {'gloo 2p':>9} {'tpu 2p':>9} {'tpu/gloo':>9} {'tpu 2dev':>9} {'2dev/gloo':>9} {'tpu 4dev':>9}")
        for mb, t_gloo, t_tpu, t_2dev, t_4dev in rows:
            print(f"{mb:>6} {t_gloo:>9.4f} {t_tpu:>9.4f} {t_tpu / t_gloo:>9.2f} "
                  f"{t_2dev:>9.4f} {t_2dev / t_gloo:>9.2f} {t_4dev:>9.4f}")
        print(f"DDP MLP step (global batch 128) on 2 processes: {ddp * 1e3:.1f} ms")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import rtpu  # noqa: F401

        worker(args)
        return
    import rtpu  # noqa: F401

    single = ddp_step_time(args.repeats, 1)
    print(f"MLP step (batch 128) in 1 process: {single * 1e3:.1f} ms")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               __file__, "--worker", "--max-mb", str(args.max_mb), "--repeats", str(args.repeats)]
    subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
