"""The GPT step as one SPMD program over a 4-device mesh next to one device,
at the same global batch: step time (median, device waited for), first step
(compile), collectives the partitioner inserted and the bytes they move per
step per device. Layouts: data parallel (batch split), FSDP-style
(parameters split on dim 0, batch split) and a 2x2 data x model mesh
(Megatron MLP split). A benchmark, not a test: numbers vary by machine. On
the CPU plugin the 4 devices share this machine's cores, so a mesh shows the
partitioning's overhead, not a speed-up.

    python benches/bench_spmd.py [--steps N]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

# A cache of this run's own, so the first step is a real compile.
os.environ["RTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="rtpu-bench-cache-")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import rtpu  # noqa: E402
from rtpu.distributed import Mesh, mark_sharding  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from gpt import GPT  # noqa: E402  (the examples' and tests' GPT)

MEGATRON = {"mlp.0.weight": ("model", None), "mlp.0.bias": ("model",), "mlp.2.weight": (None, "model")}


def layouts():
    """name -> (mesh, parameter spec of (name, parameter)) or None for one device."""
    line = Mesh((4,), ("data",))
    grid = Mesh((2, 2), ("data", "model"))
    return {
        "1 device": None,
        "data parallel (4)": (line, lambda name, p: None),
        "fsdp (4)": (line, lambda name, p: ("data",) if p.shape[0] % 4 == 0 else None),
        "data x model (2x2)": (grid, lambda name, p: MEGATRON.get(name.split(".", 2)[-1])),
    }


def run(layout, steps):
    torch.manual_seed(0)
    model = GPT(vocab=1024, d=256, heads=4, layers=4, context=128).to("tpu")
    if layout is not None:
        mesh, spec = layout
        for name, p in model.named_parameters():
            if spec(name, p) is not None:
                mark_sharding(p, mesh, spec(name, p))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    tokens = torch.randint(0, 1024, (8, 129))
    x_cpu, y_cpu = tokens[:, :-1], tokens[:, 1:]
    times, before = [], {}
    for step in range(steps + 1):
        if step == 1:
            before = rtpu.metrics()
        start = time.perf_counter()
        with rtpu.step():
            x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
            if layout is not None:
                mark_sharding(x, mesh, ("data", None))
                mark_sharding(y, mesh, ("data", None))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
        loss.item()
        torch.tpu.synchronize()
        times.append(time.perf_counter() - start)
    after = rtpu.metrics()
    return {
        "first": times[0],
        "step": statistics.median(times[1:]),
        "bytes": (after["spmd_collective_bytes"] - before["spmd_collective_bytes"]) / steps,
        "loss": loss.item(),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if torch.tpu.device_count() < 4:
        sys.exit("needs 4 tpu devices (RTPU_CPU_DEVICES=4 on the CPU plugin)")
    results = {}
    for name, layout in layouts().items():
        start = rtpu.metrics()["spmd_collectives"]
        result = run(layout, args.steps)
        result["collectives"] = rtpu.metrics()["spmd_collectives"] - start
        results[name] = result
    base = results["1 device"]["step"]
    print(f"GPT (4 layers, d=256, T=128, global batch 8, AdamW), {args.steps} steps after the first")
    print(f"{'layout':<20} {'step ms':>9} {'x 1 device':>10} {'first s':>8} {'collectives':>11} {'MB/step/device':>15} {'loss':>9}")
    for name, r in results.items():
        print(
            f"{name:<20} {r['step'] * 1e3:>9.1f} {r['step'] / base:>10.2f} {r['first']:>8.2f} "
            f"{r['collectives']:>11} {r['bytes'] / 2**20:>15.2f} {r['loss']:>9.4f}"
        )


if __name__ == "__main__":
    main()
