"""Trains a small GPT (token and position embeddings, pre-norm blocks of
causal scaled-dot-product attention and a GELU MLP, AdamW) on the 'tpu'
device to continue a repeating token pattern; prints the loss per step and
rtpu's metrics.
"""

import argparse

import torch

from gpt import GPT
from training import train


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="tpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    vocab, context = 64, 32
    model = GPT(vocab, d=64, heads=4, layers=2, context=context).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def next_batch():
        # Sequences that count up from a random start, modulo the vocabulary.
        first = torch.randint(0, vocab, (8, 1))
        seq = (first + torch.arange(context + 1)) % vocab
        return seq[:, :-1], seq[:, 1:]

    train(model, optimizer, next_batch, args.steps, args.device)


if __name__ == "__main__":
    main()
