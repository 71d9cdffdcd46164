"""Whole-step training speed on 'tpu' in step mode (one XLA program per
step, recorded op by op) and compile mode (`torch.compile(train_step,
backend="tpu")`: captured graphs replayed) next to PyTorch CPU eager and,
when their interpreters are given, JAX (jit) and torch_xla (PJRT CPU) on the
same models, in one run, with ratios; plus rtpu's recording cost per op. A
benchmark, not a test: numbers vary by machine.

The "cpu aot_eager" row is torch.compile's own tracing (Dynamo and
AOTAutograd, no compiler) on CPU: compile mode's first step cannot be
shorter than its first step, whatever the backend.

Models: an MLP (784-1024-1024-10, batch 128, SGD) and a GPT (4 layers,
d=256, 4 heads, T=128, batch 8, vocab 1024, AdamW); `--models` adds the GPT
at d=512 and 1024 and at T=512 (`sizes.py`). Every step is timed to
completion (the device is waited for), for every framework alike. rtpu's
modes, JAX and torch_xla each run in a process of their own, which reports
its peak resident memory over steps each waited for (on the CPU plugins
device buffers live there too; step mode's peak with no wait between steps
is printed apart) and what it held idle before the model ("idle MiB": the
framework's import and client; for rtpu, torch._dynamo too, which any
optimizer imports).
The last lines hold the results against issue #17's targets.

    python benches/bench_step.py [--models mlp,gpt,gpt-d512,gpt-d1024,gpt-t512]
        [--jax-python VENV/bin/python] [--torch-xla-python VENV/bin/python]
        [--rounds N]

With `--rounds N` every configuration runs N times, the configurations
taking turns, and each figure is its median over the rounds: the ratios
then move less with the machine's slow minutes.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

# A cache of this run's own, so the first step is a real compile. The
# parent gives each rtpu worker a fresh one, then runs it again on the same
# one to time the first step of a warm second run.
os.environ.setdefault("RTPU_CACHE_DIR", tempfile.mkdtemp(prefix="rtpu-bench-cache-"))

import torch  # noqa: E402

import rtpu  # noqa: E402
from rtpu import _plugin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from gpt import GPT  # noqa: E402  (the examples' and tests' GPT)
from training import train_step  # noqa: E402  (and their training step)

from sizes import GPT_BATCH, GPT_HEADS, GPT_LAYERS, GPT_SIZES, GPT_VOCAB, MODEL_NAMES  # noqa: E402
from timing import peak_rss_mb  # noqa: E402


def mlp_setup(device):
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = (torch.randn(128, 784), torch.randint(0, 10, (128,)))
    return model, optimizer, batch


def gpt_setup(device, name):
    d, context = GPT_SIZES[name]
    model = GPT(vocab=GPT_VOCAB, d=d, heads=GPT_HEADS, layers=GPT_LAYERS, context=context).to(device)
    # capturable keeps AdamW's step counts on the device, so a compiled
    # optimizer step has no CPU inputs (and replays); the math is the same.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-3, weight_decay=0.01, capturable=device == "tpu"
    )
    tokens = torch.randint(0, GPT_VOCAB, (GPT_BATCH, context + 1))
    return model, optimizer, (tokens[:, :-1], tokens[:, 1:])


def setup(name, device):
    """The model `name`, its optimizer and one batch (on the CPU)."""
    return mlp_setup(device) if name == "mlp" else gpt_setup(device, name)


def run_cpu(name, steps, warmup, backend=None):
    """PyTorch on CPU: eager, or under torch.compile with `backend`. With
    "aot_eager" (Dynamo and AOTAutograd tracing with no compiler behind
    them) the first step is the least any torch.compile backend can take."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, optimizer, (x, y) = setup(name, "cpu")
    step = train_step if backend is None else torch.compile(train_step, backend=backend)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step(model, optimizer, x, y)
        times.append(time.perf_counter() - start)
    return {"first_step_s": times[0], "median_step_s": statistics.median(times[warmup:])}


def timed_steps(one_step, steps, warmup):
    """Runs `one_step()`, which returns the loss and when its host part
    ended, warmup + steps times, each timed to completion. Returns each
    step's seconds, each host part's seconds, and rtpu's metrics after
    warm-up and at the end."""
    times, host_s = [], []
    for i in range(warmup + steps):
        if i == warmup:
            counted = rtpu.metrics()
        start = time.perf_counter()
        loss, host_done = one_step()
        torch.tpu.synchronize()
        times.append(time.perf_counter() - start)
        host_s.append(host_done - start)
    after = rtpu.metrics()
    assert math.isfinite(loss.item())
    return times, host_s, counted, after


def run_rtpu_step(name, steps, warmup):
    torch.manual_seed(0)
    model, optimizer, (x_cpu, y_cpu) = setup(name, "tpu")
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    torch.tpu.synchronize()
    before = rtpu.metrics()

    def one_step():
        with rtpu.step():
            loss = train_step(model, optimizer, x, y)
            recorded = time.perf_counter()
        return loss, recorded

    times, record_s, counted, after = timed_steps(one_step, steps, warmup)
    ops_per_step = (after["ops_recorded"] - counted["ops_recorded"]) / steps
    # With every step waited for, as JAX's and torch_xla's are.
    synced_peak_rss_mb = peak_rss_mb()
    # As a training loop runs when it does not read the loss every step:
    # each step is recorded while the device runs the one before, whose
    # buffers and temporaries are still held.
    start = time.perf_counter()
    for _ in range(steps):
        with rtpu.step():
            loss = train_step(model, optimizer, x, y)
    torch.tpu.synchronize()
    pipelined_s = (time.perf_counter() - start) / steps
    return {
        "pipelined_step_s": pipelined_s,
        "peak_rss_mb": synced_peak_rss_mb,
        "pipelined_peak_rss_mb": peak_rss_mb(),
        "first_step_s": times[0],
        "median_step_s": statistics.median(times[warmup:]),
        "ops_per_step": ops_per_step,
        # The host's whole cost of recording an op (Python, dispatcher,
        # shim and core), and the core's part of it.
        "record_us_per_op": statistics.median(record_s[warmup:]) / ops_per_step * 1e6,
        "core_record_us_per_op": (after["record_ns"] - counted["record_ns"])
        / (after["ops_recorded"] - counted["ops_recorded"])
        / 1e3,
        "compiles_after_warmup": after["executables_compiled"] - counted["executables_compiled"],
        "compiles": after["executables_compiled"] - before["executables_compiled"],
    }


def run_rtpu_compile(name, steps, warmup):
    # Each model is traced afresh: after another model's shapes, Dynamo
    # would trace this one with dynamic shapes.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, optimizer, (x_cpu, y_cpu) = setup(name, "tpu")
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    step = torch.compile(train_step, backend="tpu")
    torch.tpu.synchronize()
    times, host_s, counted, after = timed_steps(
        lambda: (step(model, optimizer, x, y), time.perf_counter()), steps, warmup
    )
    return {
        "first_step_s": times[0],
        "median_step_s": statistics.median(times[warmup:]),
        # How long the call held the host (guards, replays, and any wait
        # for the device inside them), as a share of the whole step.
        "host_share": statistics.median(host_s[warmup:]) / statistics.median(times[warmup:]),
        "compiles_after_warmup": after["executables_compiled"] - counted["executables_compiled"],
        "ops_recorded_after_warmup": after["ops_recorded"] - counted["ops_recorded"],
    }


def recording_cost(ops=2000, rounds=5):
    """Host time per op of a chain of small elementwise ops: recorded in a
    step (Python call, dispatcher, shim and core) and the core's part of
    that; dispatched eagerly (each op its own launch, the device waited for
    at the end); and run by PyTorch on CPU tensors: Python's and the
    dispatcher's own cost, which no device can go under. Medians of
    `rounds` rounds after a first that compiles: one round is a few
    milliseconds, which another process on the machine can double."""

    def chain(y):
        for _ in range(ops // 2):
            y = y * 1.0001 + 0.5
        return y

    x = torch.randn(64, device="tpu")
    y = x.cpu()
    measured = []
    for i in range(rounds + 1):
        before = rtpu.metrics()
        start = time.perf_counter()
        with rtpu.step():
            chain(x)
            recorded = time.perf_counter()
        after = rtpu.metrics()
        eager_start = time.perf_counter()
        chain(x)
        torch.tpu.synchronize()
        eager_s = time.perf_counter() - eager_start
        cpu_start = time.perf_counter()
        chain(y)
        cpu_s = time.perf_counter() - cpu_start
        if i > 0:  # the first round compiles
            measured.append(
                {
                    "step_us": (recorded - start) / ops * 1e6,
                    "core_us": (after["record_ns"] - before["record_ns"])
                    / (after["ops_recorded"] - before["ops_recorded"])
                    / 1e3,
                    "eager_us": eager_s / ops * 1e6,
                    "cpu_us": cpu_s / ops * 1e6,
                }
            )
    return {key: statistics.median(m[key] for m in measured) for key in measured[0]}


def run_other(python, script, name, steps, warmup, env=None, extra_args=()):
    done = subprocess.run(
        [python, os.path.join(HERE, script), "--model", name, "--steps", str(steps), "--warmup", str(warmup), *extra_args],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    if done.returncode != 0:
        print(f"{script} --model {name} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_rtpu_cold_then_warm(mode, name, steps, warmup):
    """One rtpu mode on one model in a process of its own with an empty
    disk cache, then its first step again in a second process on the cache
    the first one filled: what a user's second run of a script waits for."""
    env = dict(os.environ, RTPU_CACHE_DIR=tempfile.mkdtemp(prefix="rtpu-bench-cache-"))
    worker = ["--worker", mode]
    result = run_other(sys.executable, "bench_step.py", name, steps, warmup, env=env, extra_args=worker)
    warm = run_other(sys.executable, "bench_step.py", name, 1, 0, env=env, extra_args=worker)
    if result and warm:
        result["warm_first_step_s"] = warm["first_step_s"]
    return result


def run_rtpu_worker(mode, name, steps, warmup):
    """One rtpu mode on one model, in this process alone: its times and its
    peak memory, as one JSON line for the parent."""
    # The process before the model: torch, rtpu and its client, and
    # torch._dynamo, which creating any optimizer imports (with Triton).
    import torch._dynamo  # noqa: F401

    torch.ones(1, device="tpu").cpu()
    idle_rss_mb = peak_rss_mb()
    torch.tpu.reset_peak_memory_stats()
    result = (run_rtpu_step if mode == "step" else run_rtpu_compile)(name, steps, warmup)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    result["idle_rss_mb"] = idle_rss_mb
    result["peak_device_mb"] = torch.tpu.max_memory_allocated() / 2**20
    print(json.dumps(result))


def print_table(name, results, steps, rounds):
    ours, compiled = results["rtpu step"], results["rtpu compile"]
    over_rounds = f", medians of {rounds} rounds" if rounds > 1 else ""
    print(f"\n{name}: median step time over {steps} steps (first step: compile included{over_rounds})")
    print(
        f"  {'':<17}{'step ms':>10}{'first s':>10}{'step/this':>11}{'compile/this':>14}{'peak MiB':>10}"
        f"{'idle MiB':>10}"
    )
    for label, r in results.items():
        if r is None:
            print(f"  {label:<17}{'failed':>10}")
            continue
        step_ratio = ours["median_step_s"] / r["median_step_s"] if ours else math.nan
        compile_ratio = compiled["median_step_s"] / r["median_step_s"] if compiled else math.nan
        print(
            f"  {label:<17}{r['median_step_s'] * 1e3:>10.2f}{r['first_step_s']:>10.2f}"
            f"{step_ratio:>11.2f}{compile_ratio:>14.2f}{r.get('peak_rss_mb', math.nan):>10.0f}"
            f"{r.get('idle_rss_mb') or math.nan:>10.0f}"
        )
    if ours:
        print(
            f"  step mode: {ours['ops_per_step']:.0f} ops/step recorded at {ours['record_us_per_op']:.2f} us/op "
            f"on the host ({ours['core_record_us_per_op']:.2f} us/op in rtpu's core); "
            f"compiles after warm-up: {ours['compiles_after_warmup']}; "
            f"{ours['pipelined_step_s'] * 1e3:.2f} ms/step with no wait between steps "
            f"(peak {ours['pipelined_peak_rss_mb']:.0f} MiB); "
            f"peak device memory {ours['peak_device_mb']:.0f} MiB; "
            f"first step of a warm second run {ours.get('warm_first_step_s', math.nan):.2f} s"
        )
    if compiled:
        print(
            f"  compile mode: compiles after warm-up: {compiled['compiles_after_warmup']}, "
            f"ops recorded after warm-up: {compiled['ops_recorded_after_warmup']}, "
            f"the call holds the host for {compiled['host_share']:.0%} of the step; "
            f"first step of a warm second run {compiled.get('warm_first_step_s', math.nan):.2f} s"
        )


def print_targets(chain, all_results):
    """Issue #17's targets, each with what was measured and whether it holds;
    a target whose reference was not run says so."""
    rows = []

    def target(what, value, limit, unit=""):
        if value is None or math.isnan(value):
            rows.append(f"  {what}: not measured (its reference was not run)")
        else:
            verdict = "met" if value <= limit else "NOT MET"
            rows.append(f"  {what}: {value:.2f}{unit} (target <= {limit}{unit}) {verdict}")

    def ratio(results, mode, reference, key="median_step_s"):
        ours, ref = results.get(mode), results.get(reference)
        return ours[key] / ref[key] if ours and ref else None

    def above_idle_ratio(results, mode):
        """Peak memory past what each framework's process holds before the
        model: the model's share, without torch's and JAX's own import."""
        ours, ref = results.get(mode), results.get("jax jit")
        if not (ours and ref and ref.get("idle_rss_mb")):
            return "not measured"
        above = [r["peak_rss_mb"] - r["idle_rss_mb"] for r in (ours, ref)]
        return f"{above[0] / above[1]:.2f}x, {above[0]:.0f} against {above[1]:.0f} MiB"

    for name, results in all_results.items():
        for mode in ("rtpu step", "rtpu compile"):
            if name == "mlp":
                target(f"mlp {mode} / jax on our plugin", ratio(results, mode, "jax (plugin)"), 1.0, "x")
                target(f"mlp {mode} / jax on its own XLA", ratio(results, mode, "jax jit"), 1.1, "x")
            else:
                target(f"{name} {mode} / jax", ratio(results, mode, "jax jit"), 0.8, "x")
                target(f"{name} {mode} / torch_xla", ratio(results, mode, "torch_xla"), 0.8, "x")
            target(f"{name} {mode} peak memory / jax's", ratio(results, mode, "jax jit", "peak_rss_mb"), 1.0, "x")
            rows.append(f"    (above each idle process: {above_idle_ratio(results, mode)})")
        target(f"{name} first step, step mode / torch_xla's", ratio(results, "rtpu step", "torch_xla", "first_step_s"), 1.0, "x")
        target(
            f"{name} first step, compile mode / torch_xla dynamo's",
            ratio(results, "rtpu compile", "torch_xla dynamo", "first_step_s"),
            1.5,
            "x",
        )
        for mode in ("step", "compile"):
            if results.get(f"rtpu {mode}"):
                warm_s = results[f"rtpu {mode}"].get("warm_first_step_s")
                target(f"{name} first step of a warm second run (disk cache), {mode} mode", warm_s, 2, " s")
        if results.get("rtpu step"):
            target(f"{name} step mode host time per recorded op", results["rtpu step"]["record_us_per_op"], 25, " us")
        if results.get("rtpu compile"):
            # "A small fraction": a quarter, so that three quarters of the
            # step are left for the host to run ahead.
            target(f"{name} compile mode host share of the step", results["rtpu compile"]["host_share"], 0.25)
    target("chain of small ops recorded in a step, per op", chain["step_us"], 5, " us")
    target("eager dispatch per op", chain["eager_us"], 5, " us")
    print("\ntargets (issue #17):")
    print("\n".join(rows))


def run_all(name, args, own_xla_env):
    """Every configuration on model `name` once, one after the other, by label."""
    results = {
        f"rtpu {mode}": run_rtpu_cold_then_warm(mode, name, args.steps, args.warmup) for mode in ("step", "compile")
    }
    results["cpu eager"] = run_cpu(name, args.steps, args.warmup)
    results["cpu aot_eager"] = run_cpu(name, args.steps, args.warmup, backend="aot_eager")
    if args.jax_python:
        results["jax jit"] = run_other(
            args.jax_python, "jax_models.py", name, args.steps, args.warmup, env=own_xla_env
        )
        # The same JAX program on the XLA CPU plugin rtpu runs on (a
        # different XLA build from jaxlib's own CPU client), with the
        # XLA_FLAGS rtpu gives it: separates rtpu's costs from the
        # plugin's.
        results["jax (plugin)"] = run_other(
            args.jax_python,
            "jax_models.py",
            name,
            args.steps,
            args.warmup,
            env=dict(
                os.environ,
                PJRT_NAMES_AND_LIBRARY_PATHS=f"rtpucpu:{os.environ['RTPU_PLUGIN']}",
                JAX_PLATFORMS="rtpucpu",
            ),
        )
    if args.torch_xla_python:
        results["torch_xla"] = run_other(
            args.torch_xla_python, "torch_xla_models.py", name, args.steps, args.warmup, env=own_xla_env
        )
        # torch_xla's own torch.compile backend: compile mode's peer.
        results["torch_xla dynamo"] = run_other(
            args.torch_xla_python,
            "torch_xla_models.py",
            name,
            args.steps,
            args.warmup,
            env=own_xla_env,
            extra_args=["--compile"],
        )
    return results


def median_of_rounds(rounds):
    """Per configuration, each figure's median over the rounds that ran it
    (None where no round did)."""
    combined = {}
    for label in rounds[0]:
        ran = [r[label] for r in rounds if r.get(label)]
        if not ran:
            combined[label] = None
            continue
        combined[label] = {
            key: statistics.median(r[key] for r in ran)
            if all(isinstance(r.get(key), (int, float)) for r in ran)
            else ran[0].get(key)
            for key in ran[0]
        }
    return combined


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default="mlp,gpt", help=f"a comma-separated list of {', '.join(MODEL_NAMES)}")
    parser.add_argument("--jax-python", help="a Python with jax installed")
    parser.add_argument("--torch-xla-python", help="a Python with torch_xla installed")
    parser.add_argument(
        "--rounds", type=int, default=1, help="run every configuration this many times, interleaved; report medians"
    )
    # How the parent runs each rtpu mode in a process of its own.
    parser.add_argument("--worker", choices=["step", "compile"], help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODEL_NAMES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_rtpu_worker(args.worker, args.model, args.steps, args.warmup)
        return
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    unknown = set(args.models.split(",")) - set(MODEL_NAMES)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}: choose from {MODEL_NAMES}")

    # The process's first few hundred milliseconds of ops run up to 1.7x
    # slower here, CPU eager's as much as rtpu's: one untimed call first.
    recording_cost()
    chain = recording_cost()
    print(
        f"a chain of small ops: {chain['step_us']:.2f} us/op recorded in a step ({chain['core_us']:.2f} in rtpu's "
        f"core), {chain['eager_us']:.2f} us/op eagerly; the same ops on CPU eager: {chain['cpu_us']:.2f} us/op"
    )
    # JAX and torch_xla on their own XLA run with the XLA_FLAGS this run was
    # given, not those rtpu adds for its plugin.
    own_xla_env = _plugin.user_environment()
    all_results = {}
    for name in args.models.split(","):
        # Rounds interleave the configurations, so that a slow minute on
        # this noisy machine lands on all of them rather than on one.
        rounds = [run_all(name, args, own_xla_env) for _ in range(args.rounds)]
        results = median_of_rounds(rounds)
        # The CPU rows run in this process, whose imports and caches later
        # rounds find warm: only the first round's first step is a fresh
        # process's, as every other row's is.
        for label in ("cpu eager", "cpu aot_eager"):
            results[label]["first_step_s"] = rounds[0][label]["first_step_s"]
        print_table(name, results, args.steps, args.rounds)
        all_results[name] = results
    print_targets(chain, all_results)


if __name__ == "__main__":
    main()
