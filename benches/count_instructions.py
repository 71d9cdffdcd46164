"""Host cost counted in instructions (callgrind), the measure that repeats on
a noisy machine where timings move 10-30% from run to run (issue #17). Each
workload runs in a child under valgrind with instrumentation off until its
warm-up is done, so only the measured steps count, split by thread (Python's
thread; XLA's workers, on the CPU plugin the device) and, on Python's thread,
by library: rtpu's core (librtpu.so), its shim (librtpu_torch.so), the
plugin, PyTorch, Python, libc.

    .venv/bin/python benches/count_instructions.py [--workloads mlp-step,chain-eager] [--steps N] [--keep DIR]

With --keep, callgrind's files stay in DIR/WORKLOAD/ for a look by function:
`callgrind_annotate --inclusive=yes DIR/chain-eager/callgrind.out-01`.

The MLP has bench_step.py's MLP layers at 8 wide, so its device work is
negligible and the count is the host's; `mlp-cpu` is the same step on
PyTorch's CPU eager (its OpenMP threads spin in libgomp, on Python's thread
too). XLA runs capped at AVX2 here: valgrind has no AVX-512.
"""

import argparse
import collections
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile

# Each workload: what it runs, and whether its steps record or run ops one
# by one (so a count per op means something).
WORKLOADS = {
    "mlp-step": ("the 8-wide MLP's training step recorded in rtpu.step()", True),
    "mlp-compile": ("the same step under torch.compile(backend='tpu'): replays", False),
    "mlp-cpu": ("the same step on PyTorch CPU eager", False),
    "chain-step": ("a chain of 200 small elementwise ops recorded in rtpu.step()", True),
    "chain-eager": ("the same chain run eagerly on tpu, op by op", True),
}


def worker(workload, steps, go_read, done_write):
    """Runs `workload`: warms it up, says so on `done_write`, waits for the
    parent's go on `go_read` (instrumentation on), runs `steps` steps, sends
    the ops they recorded or ran, and waits to be let go."""
    import torch

    import rtpu

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from training import train_step  # the step the examples, tests and benchmarks share

    device = "cpu" if workload == "mlp-cpu" else "tpu"
    if workload.startswith("mlp"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)
        ).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8).to(device), torch.randint(0, 10, (4,)).to(device)

        compiled = torch.compile(train_step, backend="tpu") if workload == "mlp-compile" else None

        def one():
            if workload == "mlp-step":
                with rtpu.step():
                    train_step(model, optimizer, x, y)
            else:
                (compiled or train_step)(model, optimizer, x, y)
    else:
        start = torch.randn(64, device=device)

        def chain():
            y = start
            for _ in range(100):
                y = y * 1.0001 + 0.5

        def one():
            if workload == "chain-step":
                with rtpu.step():
                    chain()
            else:
                chain()

    def synced():
        one()
        if device == "tpu":
            torch.tpu.synchronize()

    for _ in range(20):
        synced()
    os.write(done_write, b"w")
    os.read(go_read, 1)
    before = rtpu.metrics()
    for _ in range(steps):
        synced()
    after = rtpu.metrics()
    ops = sum(after[k] - before[k] for k in ("ops_recorded", "ops_run"))
    os.write(done_write, json.dumps({"ops": ops}).encode() + b"\n")
    os.read(go_read, 1)


def self_cost_by_object(path):
    """Instructions a callgrind output file counts in each object's own code
    (a call's inclusive cost, the line after `calls=`, is not added)."""
    names, costs = {}, collections.Counter()
    current, skip_next = None, False
    with open(path) as f:
        for line in f:
            if line.startswith(("ob=", "cob=")):
                # "(id) name" defines a compressed name, "(id)" reuses it;
                # callee objects (cob=) share the ids.
                spec = line.partition("=")[2].strip()
                ident, _, name = spec.partition(")") if spec.startswith("(") else ("", "", spec)
                if name.strip():
                    names[ident] = name.strip()
                if line.startswith("ob="):
                    current = names.get(ident, spec)
            elif line.startswith("calls="):
                skip_next = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    costs[os.path.basename(current or "?")] += int(parts[1])
    return costs


def count(workload, steps, keep=None):
    """Runs `workload` under callgrind; returns its ops and the
    instructions of each thread by object. Callgrind's files stay in
    `keep`/`workload` when `keep` is given."""
    with contextlib.ExitStack() as stack:
        if keep:
            out_dir = os.path.join(keep, workload)
            os.makedirs(out_dir, exist_ok=True)
            for stale in glob.glob(os.path.join(out_dir, "callgrind.out*")):
                os.remove(stale)
        else:
            out_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="rtpu-callgrind-"))
        out = os.path.join(out_dir, "callgrind.out")
        go_read, go_write = os.pipe()
        done_read, done_write = os.pipe()
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX2").strip())
        # Valgrind's messages go to a file: a pipe nobody reads could fill
        # and stop the child mid-step.
        log_path = os.path.join(out_dir, "valgrind.log")
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes", f"--callgrind-out-file={out}"]
                + [sys.executable, os.path.abspath(__file__), "--worker", workload, str(steps), str(go_read), str(done_write)],
                env=env,
                pass_fds=(go_read, done_write),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        os.close(go_read)
        os.close(done_write)
        with os.fdopen(done_read, "rb") as done, os.fdopen(go_write, "wb", buffering=0) as go:

            def died(when):
                child.wait()
                with open(log_path, errors="replace") as log:
                    return SystemExit(f"{workload}: the worker died {when}:\n{log.read()[-3000:]}")

            if done.read(1) != b"w":
                raise died("warming up")
            subprocess.run(["callgrind_control", "-i", "on", str(child.pid)], check=True, capture_output=True)
            go.write(b"g")
            measured = done.readline()
            if not measured:
                raise died("in its measured steps")
            ops = json.loads(measured)["ops"]
            subprocess.run(["callgrind_control", "-i", "off", str(child.pid)], check=True, capture_output=True)
            go.write(b"e")
        child.wait(timeout=600)
        threads = {path: self_cost_by_object(path) for path in sorted(glob.glob(out + "-*"))}
    return ops, threads


def report(workload, steps, ops, threads):
    # Valgrind numbers threads from 1, the process's first (Python's) thread.
    main_path = next(p for p in threads if p.endswith("-01"))
    main = threads[main_path]
    others = sum(sum(c.values()) for p, c in threads.items() if p != main_path)
    total = sum(main.values())
    what, per_op = WORKLOADS[workload]
    print(f"\n{workload}: {what}; {steps} steps")
    per = f", {total / ops / 1e3:.1f}k per op over {ops / steps:.0f} ops" if per_op and ops else ""
    print(f"  Python's thread: {total / steps / 1e3:.0f}k instructions per step{per}")
    for name, cost in main.most_common(8):
        print(f"    {name:<40} {cost / steps / 1e3:>8.0f}k  {cost / total:>6.1%}")
    print(f"  other threads (XLA's workers, PyTorch's): {others / steps / 1e3:.0f}k per step")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp-step,mlp-cpu,chain-step,chain-eager")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--keep", metavar="DIR", help="keep callgrind's files in DIR/WORKLOAD/")
    parser.add_argument("--worker", nargs=4, metavar=("WORKLOAD", "STEPS", "GO_FD", "DONE_FD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        workload, steps, go_read, done_write = args.worker
        worker(workload, int(steps), int(go_read), int(done_write))
        return
    for workload in args.workloads.split(","):
        if workload not in WORKLOADS:
            parser.error(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")
        ops, threads = count(workload, args.steps, args.keep)
        report(workload, args.steps, ops, threads)


if __name__ == "__main__":
    main()
