"""The XLA programs behind one training step, rtpu's next to JAX's, for the
models of bench_step.py: where the two differ in work the device does.

Runs one rtpu step-mode step and JAX's jitted step (with `--jax-python`, on
rtpu's plugin, so one XLA build compiles both) with XLA's dump turned on,
keeps the dumps under `--out`, and prints, per program, what its optimized
HLO holds: parameters and outputs, outputs aliasing a donated parameter, dots,
fusions, copies and the bytes they move, and the bytes of all its buffers
(parameters, outputs and temporaries). A copy is the usual
extra cost: XLA inserts one where an overwritten (donated) input is still
read after the write could have run.

    python benches/compare_programs.py [--models mlp,gpt] [--jax-python P] [--out DIR]

Under `--out`: `<model>/rtpu/` and `<model>/jax/`, each XLA's dump of every
program that process compiled, and for rtpu `stablehlo/`, the StableHLO text
rtpu handed to XLA (JAX's is `*before_optimizations*` in its dump).
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sizes import MODEL_NAMES  # noqa: E402

BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s16": 2, "s8": 1, "u8": 1, "pred": 1}
SHAPE = re.compile(r"\b(" + "|".join(BYTES) + r")\[([0-9,]*)\]")


def shape_bytes(text):
    """Bytes of the first array shape in `text`, such as `f32[128,1024]{1,0}`."""
    found = SHAPE.search(text)
    if not found:
        return 0
    elements = 1
    for dim in filter(None, found.group(2).split(",")):
        elements *= int(dim)
    return elements * BYTES[found.group(1)]


def summarize(hlo_text, memory_report):
    """What the entry computation of an optimized HLO module does, and the
    bytes of all its buffers from XLA's memory report."""
    header = hlo_text.splitlines()[0]
    entry = hlo_text[hlo_text.index("\nENTRY ") :]
    instructions = [line.strip() for line in entry.splitlines()[1:] if " = " in line]
    ops = [re.search(r" = \S+ (\S+?)\(", line) for line in instructions]
    kinds = [op.group(1) if op else "" for op in ops]
    copies = [line for line, kind in zip(instructions, kinds) if kind == "copy"]
    root = next(line for line in instructions if line.startswith("ROOT "))
    # A tuple ROOT's type lists one shape ("f32[...]") per output.
    root_type = root.split(" = ", 1)[1].split(" tuple(")[0]
    allocation = re.match(r"Total bytes used: (\d+)", memory_report)
    return {
        "parameters": kinds.count("parameter"),
        "outputs": root_type.count("[") if " tuple(" in root else 1,
        "donated": header.count("may-alias") + header.count("must-alias"),
        "dots": sum(kind in ("dot", "convolution") for kind in kinds),
        "fusions": kinds.count("fusion"),
        "copies": len(copies),
        "copied MiB": sum(shape_bytes(line.split(" = ", 1)[1]) for line in copies) / 2**20,
        "buffers MiB": int(allocation.group(1)) / 2**20 if allocation else float("nan"),
    }


def step_program(dump_dir, name_pattern):
    """The optimized HLO of the biggest program in an XLA dump whose module
    name matches: the training step (the others are uploads and helpers)."""
    paths = glob.glob(os.path.join(dump_dir, f"*{name_pattern}*cpu_after_optimizations.txt"))
    if not paths:
        raise SystemExit(f"no optimized program matching {name_pattern!r} in {dump_dir}")
    path = max(paths, key=os.path.getsize)
    with open(path) as f:
        text = f.read()
    # XLA's memory report, which starts "Total bytes used: N".
    with open(path.replace(".txt", "-memory-usage-report.txt")) as f:
        return path, text, f.readline()


def run(command, env):
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def dump_rtpu(name, out):
    xla_dir, stablehlo_dir = os.path.join(out, "rtpu"), os.path.join(out, "rtpu", "stablehlo")
    os.makedirs(stablehlo_dir, exist_ok=True)
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_dump_to={xla_dir} --xla_dump_hlo_as_text",
        RTPU_DUMP_DIR=stablehlo_dir,
        RTPU_CACHE_DIR=tempfile.mkdtemp(prefix="rtpu-compare-cache-"),
    )
    bench = [sys.executable, os.path.join(HERE, "bench_step.py"), "--worker", "step"]
    run([*bench, "--model", name, "--steps", "1", "--warmup", "0"], env)
    return step_program(xla_dir, ".rtpu.")


def dump_jax(name, out, jax_python):
    xla_dir = os.path.join(out, "jax")
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_dump_to={xla_dir} --xla_dump_hlo_as_text",
        PJRT_NAMES_AND_LIBRARY_PATHS=f"rtpucpu:{os.environ['RTPU_PLUGIN']}",
        JAX_PLATFORMS="rtpucpu",
    )
    run([jax_python, os.path.join(HERE, "jax_models.py"), "--model", name, "--steps", "1", "--warmup", "0"], env)
    return step_program(xla_dir, "_step.")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,gpt", help=f"a comma-separated list of {', '.join(MODEL_NAMES)}")
    parser.add_argument("--jax-python", help="a Python with jax installed")
    parser.add_argument("--out", default=None, help="where the dumps go (default: a new temporary directory)")
    args = parser.parse_args()
    if "RTPU_PLUGIN" not in os.environ:
        parser.error("RTPU_PLUGIN is not set: source scripts/env.sh first")
    unknown = set(args.models.split(",")) - set(MODEL_NAMES)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}: choose from {MODEL_NAMES}")
    out = args.out or tempfile.mkdtemp(prefix="rtpu-programs-")
    for name in args.models.split(","):
        programs = {"rtpu step": dump_rtpu(name, os.path.join(out, name))}
        if args.jax_python:
            programs["jax (plugin)"] = dump_jax(name, os.path.join(out, name), args.jax_python)
        summaries = {label: summarize(text, report) for label, (_, text, report) in programs.items()}
        columns = list(next(iter(summaries.values())))
        print(f"\n{name}: the step's optimized program")
        print(f"  {'':<14}" + "".join(f"{column:>13}" for column in columns))
        for label, summary in summaries.items():
            print(f"  {label:<14}" + "".join(f"{summary[c]:>13.1f}" if isinstance(summary[c], float) else f"{summary[c]:>13}" for c in columns))
        for label, (path, *_) in programs.items():
            print(f"  {label}: {path}")


if __name__ == "__main__":
    main()
