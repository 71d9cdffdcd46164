"""A soak run, not a test: 1,000 training steps of the shared GPT in step
mode (one program per step), printing every 100 steps the process's
resident memory, rtpu's memory_allocated and its live device buffers, so a
leak shows as a column that keeps growing. A learning-rate schedule changes
a Python scalar every step, the case that once left a buffer per value.

    python benches/bench_soak.py [--steps 1000] [--every 100]
"""

import argparse
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

import rtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from gpt import GPT  # noqa: E402


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        return int(re.search(r"VmRSS:\s+(\d+) kB", status.read()).group(1)) / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    vocab, context = 256, 64
    model = GPT(vocab, 128, 4, 2, context).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    data = torch.randint(0, vocab, (16, 8, context))
    print(f"{'step':>6} {'loss':>8} {'RSS MiB':>9} {'allocated MiB':>14} {'live buffers':>13} {'s/step':>8}")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        tokens = data[step % len(data)].to("tpu")
        with rtpu.step():
            optimizer.zero_grad()
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
        schedule.step()
        if step % args.every == 0:
            value = loss.item()
            elapsed = (time.perf_counter() - start) / args.every
            print(
                f"{step:>6} {value:>8.4f} {resident_mib():>9.1f} "
                f"{torch.tpu.memory_allocated() / 2**20:>14.2f} "
                f"{rtpu.metrics()['live_buffers']:>13} {elapsed:>8.4f}"
            )
            start = time.perf_counter()


if __name__ == "__main__":
    main()
