"""One float32 matmul, 128x1024 by 1024x1024, in the three forms a Linear
layer's step runs (forward x @ W.T, input gradient dy @ W, weight gradient
dy.T @ x), on tpu with the XLA_FLAGS rtpu chooses for its plugin and with
the flags as given (`rtpu._plugin.xla_flags_for`), on PyTorch's CPU
kernels, and in JAX on its own XLA when given its interpreter. Prints the
median wall and CPU (all threads) milliseconds per call, each in a process
of its own: how much of a step's time is the plugin's dot.

    .venv/bin/python benches/bench_dot.py [--jax-python P] [--calls N]
"""

import argparse
import json
import os
import subprocess
import sys

from rtpu import _plugin  # sets RTPU_PLUGIN, and rtpu's XLA_FLAGS, here

FORMS = {
    # name: (lhs shape, rhs shape, how each is transposed before the matmul)
    "x @ W.T (forward)": ((128, 1024), (1024, 1024), (False, True)),
    "dy @ W (input grad)": ((128, 1024), (1024, 1024), (False, False)),
    "dy.T @ x (weight grad)": ((128, 1024), (128, 1024), (True, False)),
}

TORCH_WORKER = """
import json, statistics, sys, time
import torch
device, calls = sys.argv[1], int(sys.argv[2])
if device == "tpu":
    import rtpu
sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
result = {}
for name, (a, b, (ta, tb)) in json.loads(sys.argv[3]).items():
    lhs, rhs = torch.randn(*a, device=device), torch.randn(*b, device=device)
    lhs, rhs = (lhs.t() if ta else lhs), (rhs.t() if tb else rhs)
    for _ in range(5):
        lhs @ rhs
    sync()
    walls, cpu = [], time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        lhs @ rhs
        sync()
        walls.append(time.perf_counter() - start)
    result[name] = (statistics.median(walls) * 1e3, (time.process_time() - cpu) / calls * 1e3)
print(json.dumps(result))
"""

JAX_WORKER = """
import json, statistics, sys, time
import jax, jax.numpy as jnp
calls = int(sys.argv[1])
result = {}
for name, (a, b, (ta, tb)) in json.loads(sys.argv[2]).items():
    f = jax.jit(lambda l, r: (l.T if ta else l) @ (r.T if tb else r))
    lhs, rhs = jax.random.normal(jax.random.key(0), a), jax.random.normal(jax.random.key(1), b)
    for _ in range(5):
        f(lhs, rhs).block_until_ready()
    walls, cpu = [], time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        f(lhs, rhs).block_until_ready()
        walls.append(time.perf_counter() - start)
    result[name] = (statistics.median(walls) * 1e3, (time.process_time() - cpu) / calls * 1e3)
print(json.dumps(result))
"""


def run(command, env):
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        print(f"{command[:3]} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jax-python", help="a Python with jax installed")
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()

    forms = json.dumps(FORMS)
    as_given = _plugin.user_environment()
    uncapped = dict(as_given, RTPU_CPU_ISA_CAP="0")

    def torch_run(device, env):
        return run([sys.executable, "-c", TORCH_WORKER, device, str(args.calls), forms], env)

    runs = {
        f"tpu, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}": torch_run("tpu", dict(os.environ)),
        f"tpu, XLA_FLAGS={as_given.get('XLA_FLAGS', '')!r} (RTPU_CPU_ISA_CAP=0)": torch_run("tpu", uncapped),
        "PyTorch CPU": torch_run("cpu", as_given),
    }
    if args.jax_python:
        runs["JAX, its own XLA"] = run([args.jax_python, "-c", JAX_WORKER, str(args.calls), forms], as_given)
    print(f"{args.calls} calls each: median wall ms / CPU ms per call")
    for label, result in runs.items():
        print(f"  {label}")
        for name in FORMS:
            wall, cpu = result[name] if result else (float("nan"), float("nan"))
            print(f"    {name:<24}{wall:>8.2f}{cpu:>8.2f}")


if __name__ == "__main__":
    main()
