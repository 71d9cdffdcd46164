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
import time

from timing import median_seconds

FORMS = {
    # name: (lhs shape, rhs shape, whether each is transposed before the matmul)
    "x @ W.T (forward)": ((128, 1024), (1024, 1024), (False, True)),
    "dy @ W (input grad)": ((128, 1024), (1024, 1024), (False, False)),
    "dy.T @ x (weight grad)": ((128, 1024), (128, 1024), (True, False)),
}
WARMUP = 5


def torch_matmuls(device):
    """`make(lhs_shape, rhs_shape, transposed)`: a call that runs one form
    on `device` ("tpu" or "cpu") to completion."""
    import torch

    if device == "tpu":
        import rtpu  # noqa: F401  (registers the device)
    sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)

    def make(a, b, transposed):
        lhs, rhs = torch.randn(*a, device=device), torch.randn(*b, device=device)
        lhs, rhs = (lhs.t() if transposed[0] else lhs), (rhs.t() if transposed[1] else rhs)

        def matmul():
            lhs @ rhs
            sync()

        return matmul

    return make


def jax_matmuls():
    """The same as `torch_matmuls`, in JAX on its own XLA."""
    import jax

    def make(a, b, transposed):
        f = jax.jit(lambda l, r: (l.T if transposed[0] else l) @ (r.T if transposed[1] else r))
        lhs, rhs = jax.random.normal(jax.random.key(0), a), jax.random.normal(jax.random.key(1), b)
        return lambda: f(lhs, rhs).block_until_ready()

    return make


def run_worker(kind, calls):
    """Times every form in this process; prints {form: (wall ms, CPU ms)}."""
    make = jax_matmuls() if kind == "jax" else torch_matmuls(kind)
    result = {}
    for name, (a, b, transposed) in FORMS.items():
        matmul = make(a, b, transposed)
        for _ in range(WARMUP):
            matmul()
        cpu = time.process_time()
        wall = median_seconds(matmul, calls, 0)
        result[name] = (wall * 1e3, (time.process_time() - cpu) / calls * 1e3)
    print(json.dumps(result))


def run(python, kind, calls, env):
    command = [python, os.path.abspath(__file__), "--worker", kind, "--calls", str(calls)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        print(f"the {kind} worker failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jax-python", help="a Python with jax installed")
    parser.add_argument("--calls", type=int, default=100)
    # How the parent runs each configuration in a process of its own.
    parser.add_argument("--worker", choices=["tpu", "cpu", "jax"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, args.calls)
        return

    from rtpu import _plugin  # sets RTPU_PLUGIN, and rtpu's XLA_FLAGS, here

    as_given = _plugin.user_environment()
    runs = {
        f"tpu, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}": run(sys.executable, "tpu", args.calls, dict(os.environ)),
        f"tpu, XLA_FLAGS={as_given.get('XLA_FLAGS', '')!r} (RTPU_CPU_ISA_CAP=0)": run(
            sys.executable, "tpu", args.calls, dict(as_given, RTPU_CPU_ISA_CAP="0")
        ),
        "PyTorch CPU": run(sys.executable, "cpu", args.calls, as_given),
    }
    if args.jax_python:
        runs["JAX, its own XLA"] = run(args.jax_python, "jax", args.calls, as_given)
    print(f"{args.calls} calls each: median wall ms / CPU ms per call")
    for label, result in runs.items():
        print(f"  {label}")
        for name in FORMS:
            wall, cpu = result[name] if result else (float("nan"), float("nan"))
            print(f"    {name:<24}{wall:>8.2f}{cpu:>8.2f}")


if __name__ == "__main__":
    main()
