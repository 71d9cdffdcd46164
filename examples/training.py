"""The training step the examples, tests and benchmarks share, and the loop
train_cnn.py and train_gpt.py run it in. Plain PyTorch (no device
assumptions): the torch_xla benchmark imports it too."""

import time

import torch.nn.functional as F


def train_step(model, optimizer, x, y):
    """One optimizer step on the cross-entropy of `model(x)` against `y` at
    every position (a GPT's tokens, or a classifier's single one); returns
    the loss."""
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss


def train(model, optimizer, next_batch, steps, device):
    """Trains `model` on `device` for `steps` batches `next_batch()` makes on
    the CPU; prints the loss per step, the time taken and, on 'tpu', rtpu's
    metrics."""
    start = time.perf_counter()
    for step in range(steps):
        x, y = (t.to(device) for t in next_batch())
        loss = train_step(model, optimizer, x, y)
        print(f"step {step:3d}  loss {loss.item():.4f}")
    print(f"{steps} steps in {time.perf_counter() - start:.2f}s on {device}")
    if device.startswith("tpu"):
        import rtpu

        print(rtpu.metrics())
