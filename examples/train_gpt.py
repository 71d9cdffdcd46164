"""Trains a small GPT (token and position embeddings, pre-norm blocks of
causal scaled-dot-product attention and a GELU MLP, AdamW) on the 'tpu'
device to continue a repeating token pattern; prints the loss per step and
rtpu's metrics.
"""

import argparse
import time

import torch
import torch.nn.functional as F

from gpt import GPT


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="tpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    vocab, context = 64, 32
    model = GPT(vocab, d=64, heads=4, layers=2, context=context).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    for step in range(args.steps):
        # Sequences that count up from a random start, modulo the vocabulary.
        first = torch.randint(0, vocab, (8, 1))
        seq = (first + torch.arange(context + 1)) % vocab
        x, y = seq[:, :-1].to(args.device), seq[:, 1:].to(args.device)
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        print(f"step {step:3d}  loss {loss.item():.4f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.2f}s on {args.device}")
    if args.device.startswith("tpu"):
        import rtpu

        print(rtpu.metrics())


if __name__ == "__main__":
    main()
