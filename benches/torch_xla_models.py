"""PyTorch/XLA reference for the step benchmark: trains the MLP or a GPT of
benches/bench_step.py for a few steps on the PJRT CPU device and prints one
JSON line, {"model", "first_step_s", "median_step_s", "peak_rss_mb", "idle_rss_mb", ...}.
With --compile the step runs under torch.compile with torch_xla's Dynamo
backend ("openxla"), to compare with rtpu's compile mode like for like.

bench_step.py runs it as a subprocess with a Python that has `torch_xla`:

    python torch_xla_models.py --model {mlp,gpt,gpt-d512,...} --steps N --warmup W [--compile]
"""

import argparse
import json
import os
import statistics
import time

# CPU unless the caller asks otherwise; must be set before torch_xla loads.
os.environ.setdefault("PJRT_DEVICE", "CPU")

import sys

import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT  # noqa: E402  (the GPT rtpu's benchmark runs)
from training import train_step  # noqa: E402  (and the step it times)

from sizes import GPT_BATCH, GPT_HEADS, GPT_LAYERS, GPT_SIZES, GPT_VOCAB, MODEL_NAMES  # noqa: E402
from timing import peak_rss_mb  # noqa: E402

MLP_BATCH = 128


def build(model_name):
    """The model, its optimizer class and arguments, and one fixed batch (on CPU)."""
    torch.manual_seed(0)
    if model_name == "mlp":
        model = nn.Sequential(
            nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        inputs, labels = torch.randn(MLP_BATCH, 784), torch.randint(0, 10, (MLP_BATCH,))
        return model, (torch.optim.SGD, {"lr": 0.01}), inputs, labels
    d, context = GPT_SIZES[model_name]
    inputs = torch.randint(0, GPT_VOCAB, (GPT_BATCH, context))
    labels = torch.randint(0, GPT_VOCAB, (GPT_BATCH, context))
    model = GPT(vocab=GPT_VOCAB, d=d, heads=GPT_HEADS, layers=GPT_LAYERS, context=context)
    return model, (torch.optim.AdamW, {"lr": 3e-3, "weight_decay": 0.01}), inputs, labels


def xla_device():
    # torch_xla.device()/sync() are the current API; xm.* serve older releases.
    return torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()


def sync():
    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:
        xm.mark_step()


def main():
    parser = argparse.ArgumentParser(description="PyTorch/XLA reference step times for bench_step.py")
    parser.add_argument("--model", choices=MODEL_NAMES, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help='torch.compile(backend="openxla")')
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error("need --steps >= 1 and --warmup >= 0")

    device = xla_device()
    # The process before the model, as rtpu's worker measures its own:
    # torch, torch_xla and its client, and torch._dynamo.
    import torch._dynamo  # noqa: F401

    torch.ones(1, device=device).cpu()
    idle_rss_mb = peak_rss_mb()
    model, (optimizer_class, optimizer_args), inputs, labels = build(args.model)
    model.to(device)
    optimizer = optimizer_class(model.parameters(), **optimizer_args)
    inputs, labels = inputs.to(device), labels.to(device)

    # Each step ends with the graph cut, executed and finished, so the wall
    # time covers tracing, compiling when the graph is new, and running it.
    # AdamW creates its state in step 1, so step 2 compiles a second graph.
    step = torch.compile(train_step, backend="openxla") if args.compile else train_step
    times = []
    for _ in range(1 + args.warmup + args.steps):
        start = time.perf_counter()
        step(model, optimizer, inputs, labels)
        sync()
        xm.wait_device_ops()
        times.append(time.perf_counter() - start)

    first, median = times[0], statistics.median(times[1 + args.warmup :])
    result = {"model": args.model, "compile": args.compile, "first_step_s": first, "median_step_s": median}
    print(json.dumps({**result, "peak_rss_mb": peak_rss_mb(), "idle_rss_mb": idle_rss_mb, "peak_device_mb": None}))


if __name__ == "__main__":
    main()
