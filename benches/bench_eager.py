"""Eager-mode costs on 'tpu' next to PyTorch CPU eager, in one run:
µs per small `add`, and the step time of an MLP (784-1024-1024-10, batch
128, SGD), with ratios. A benchmark, not a test: numbers vary by machine.
"""

import argparse

import torch

from timing import median_seconds


def small_add(device, repeats):
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)

    def run():
        for _ in range(100):
            a.add(b)
        if device != "cpu":
            torch.tpu.synchronize()

    return median_seconds(run, repeats, warmup=5) / 100


def mlp_step(device, repeats):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 784, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()

    return median_seconds(step, repeats, warmup=5)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rows = [
        ("small add (µs/op)", small_add, 1e6),
        ("MLP step (ms)", mlp_step, 1e3),
    ]
    print(f"{'benchmark':<20}{'tpu':>12}{'cpu eager':>12}{'tpu/cpu':>10}")
    for name, fn, scale in rows:
        tpu = fn("tpu", args.repeats) * scale
        cpu = fn("cpu", args.repeats) * scale
        print(f"{name:<20}{tpu:>12.1f}{cpu:>12.1f}{tpu / cpu:>10.2f}")


if __name__ == "__main__":
    main()
