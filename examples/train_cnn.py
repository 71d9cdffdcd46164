"""Trains torchvision's resnet18 (10 classes) on synthetic 32x32 images on
the 'tpu' device and prints the loss per step and rtpu's metrics. The
labels come from a fixed random "teacher", so there is something to learn.
"""

import argparse
import time

import torch
import torchvision


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="tpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    model = torchvision.models.resnet18(num_classes=10).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 32, 32)
        y = teacher(x).argmax(dim=1)
        x, y = x.to(args.device), y.to(args.device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step:3d}  loss {loss.item():.4f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.2f}s on {args.device}")
    if args.device.startswith("tpu"):
        import rtpu

        print(rtpu.metrics())


if __name__ == "__main__":
    main()
