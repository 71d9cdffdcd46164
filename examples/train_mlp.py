"""Trains an MLP on synthetic data on the 'tpu' device (XLA's CPU plugin
unless RTPU_PLUGIN / PJRT_DEVICE choose another) and prints the loss per
step and rtpu's metrics. Plain PyTorch: `import torch` alone registers 'tpu';
`rtpu.step()` makes each training step one XLA program (`--mode eager` runs
op by op instead).
"""

import argparse
import contextlib
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--mode", choices=("step", "eager"), default="step")
    args = parser.parse_args()
    on_tpu = args.device.startswith("tpu")
    if on_tpu:
        import rtpu

    torch.manual_seed(0)
    # A fixed random "teacher" labels the data, so there is something to learn.
    teacher = torch.nn.Linear(784, 10)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    start = time.perf_counter()
    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 784)
        y = teacher(x).argmax(dim=1)
        with rtpu.step() if on_tpu and args.mode == "step" else contextlib.nullcontext():
            x, y = x.to(args.device), y.to(args.device)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        # Printed after the loop: reading a loss here would wait for its step.
        losses.append(loss.detach())
    for step, loss in enumerate(losses):
        print(f"step {step:3d}  loss {loss.item():.4f}")
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f}s on {args.device} ({args.mode} mode)")

    if on_tpu:
        print(rtpu.metrics_report())


if __name__ == "__main__":
    main()
