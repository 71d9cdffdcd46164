"""Defects a user hits without trying hard, each held by a test."""

import gc

import torch
import torch.nn.functional as F

import rtpu

DEVICE = "tpu"


def live_buffers_after(run) -> int:
    """How many device buffers `run()` left alive beyond those before it."""
    gc.collect()
    torch.tpu.synchronize()
    before = rtpu.metrics()["live_buffers"]
    run()
    gc.collect()
    torch.tpu.synchronize()
    return rtpu.metrics()["live_buffers"] - before


def test_distinct_python_scalars_leave_no_device_buffers():
    x_cpu = torch.randn(16)
    x = x_cpu.to(DEVICE)
    results = {}

    def scale(first):
        for i in range(first, first + 1000):
            results["y"] = x * (1.0 + i * 1e-4)  # a scalar never seen before

    scale(0)  # compiles; the first result stays alive in `results`
    assert live_buffers_after(lambda: scale(1000)) == 0
    torch.testing.assert_close(results["y"].cpu(), x_cpu * (1.0 + 1999 * 1e-4))


def test_adam_with_a_scheduled_learning_rate_keeps_live_buffers_flat():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    x, y = torch.randn(4, 8).to(DEVICE), torch.randn(4, 8).to(DEVICE)

    def steps(count):
        for _ in range(count):
            with rtpu.step():
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
            schedule.step()  # a new learning rate, and new bias corrections, every step

    # Compiles, creates Adam's state and fills rtpu's cache of repeated
    # scalars, which then keeps its size.
    steps(100)
    assert live_buffers_after(lambda: steps(300)) == 0
