"""Trains torchvision's resnet18 (10 classes) on synthetic 32x32 images on
the 'tpu' device and prints the loss per step and rtpu's metrics. The
labels come from a fixed random "teacher", so there is something to learn.
"""

import argparse

import torch
import torchvision

from training import train


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

    def next_batch():
        x = torch.randn(args.batch, 3, 32, 32)
        return x, teacher(x).argmax(dim=1)

    train(model, optimizer, next_batch, args.steps, args.device)


if __name__ == "__main__":
    main()
