"""PyTorch's OpInfo database as rtpu's coverage yardstick.

For each OpInfo and dtype the CPU supports, the op's sample inputs run on
'tpu' and on CPU and are compared; each (op, dtype) is reported as
  pass      every sample matched, all natively on tpu
  fallback  every sample matched, but some ATen op ran on the CPU fallback
  mismatch  a sample's result differs beyond the dtype's tolerance
  error     the op raised on tpu where it succeeded on CPU (or crashed)
and docs/ops.md is written as a generated table with the summary targets.

Run the full sweep with `.venv/bin/python tests/python/opinfo_sweep.py`;
`--ops a,b,c` restricts it (the pytest wrapper runs a fixed fast subset).
A crash in one op does not stop the sweep: ops run in a child process that
is restarted after the op that killed it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DTYPE_NAMES = ("float32", "bfloat16", "complex64")
# Samples per (op, dtype): enough to see broadcasting and non-contiguous
# cases, bounded so the full sweep stays minutes, not hours.
MAX_SAMPLES = 6
TOLERANCES = {"float32": (1.3e-5, 1e-5), "bfloat16": (1.6e-2, 1e-2), "float64": (1e-7, 1e-7), "complex64": (1.3e-5, 1e-5)}


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _to_device(tree, device):
    """Tensors moved to `device`, and device arguments (factories) pointed at it."""
    import torch
    from torch.utils._pytree import tree_map

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, torch.device) or (isinstance(x, str) and x == "cpu"):
            return torch.device(device)
        return x

    return tree_map(move, tree)


def _clone(tree):
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def _metadata(tree):
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: (x.dtype, tuple(x.shape)) if isinstance(x, torch.Tensor) else x, tree)


def _compare(got, want, dtype_name) -> str | None:
    """None when `got` (tpu) matches `want` (cpu), else what differs."""
    import torch
    from torch.utils._pytree import tree_flatten

    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    if got_spec != want_spec:
        return f"output structure {got_spec} != {want_spec}"
    rtol, atol = TOLERANCES[dtype_name]
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"expected a tensor, got {type(g).__name__}"
            if g.device.type != "tpu" and w.numel() > 0:
                return f"result on {g.device}, not tpu"
            g = g.cpu()
            if g.dtype != w.dtype or g.shape != w.shape:
                return f"{g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
            if w.is_floating_point() or w.is_complex():
                if not torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
                    wide = torch.complex128 if w.is_complex() else torch.float64
                    diff = (g.to(wide) - w.to(wide)).abs().nan_to_num().max().item()
                    return f"values differ (max abs diff {diff:.3g})"
            elif not torch.equal(g, w):
                return "values differ"
        elif g != w:
            return f"{g!r} != {w!r}"
    return None


def run_op(op, dtype_name: str, step_mode: bool = False) -> tuple[str, str]:
    """(status, detail) of one OpInfo at one dtype; with `step_mode`, each
    tpu call is recorded in an `rtpu.step()` and run when it ends."""
    import contextlib

    import torch

    import rtpu

    dtype = getattr(torch, dtype_name)
    fallbacks = lambda: dict(rtpu.metrics()["cpu_fallbacks"])  # noqa: E731
    before = fallbacks()
    # Uninitialised results (empty*) have no values to compare.
    values_defined = not (op.name.startswith("empty") or op.name.startswith("new_empty"))
    checked = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if checked == MAX_SAMPLES:
            break
        args = (sample.input, *sample.args)
        try:
            # Fresh copies per call: in-place ops mutate their inputs.
            want = op(*_clone(args), **_clone(sample.kwargs))
            random = _is_random(op, args, sample.kwargs)
        except Exception:
            continue  # CPU itself rejects this sample
        checked += 1
        try:
            with rtpu.step() if step_mode else contextlib.nullcontext():
                got = op(*_to_device(_clone(args), "tpu"), **_to_device(_clone(sample.kwargs), "tpu"))
        except Exception as e:
            return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if random or not values_defined:
            difference = _compare_metadata(got, want)
        else:
            difference = _compare(got, want, dtype_name)
        if difference:
            return "mismatch", difference
    if checked == 0:
        return "skip", "no sample runs on CPU"
    after = fallbacks()
    fell_back = sorted(name for name, count in after.items() if count > before.get(name, 0))
    if fell_back:
        return "fallback", ", ".join(fell_back)
    return "pass", ""


def _is_random(op, args, kwargs) -> bool:
    """True when the op's CPU result depends on the generator's state. OpInfo
    wraps random ops to seed 42 before each call, so that seeding is
    disabled while two other seeds are tried."""
    import torch

    seed = torch.manual_seed
    torch.manual_seed = lambda _: torch.default_generator
    try:
        with torch.random.fork_rng():
            torch.default_generator.manual_seed(0)
            first = op(*_clone(args), **_clone(kwargs))
            torch.default_generator.manual_seed(1)
            second = op(*_clone(args), **_clone(kwargs))
    finally:
        torch.manual_seed = seed
    return _compare_cpu(first, second)


def _compare_cpu(a, b) -> bool:
    """True when two CPU results differ (the op is random)."""
    import torch
    from torch.utils._pytree import tree_flatten

    for x, y in zip(tree_flatten(a)[0], tree_flatten(b)[0]):
        if isinstance(x, torch.Tensor) and not torch.equal(x.nan_to_num(), y.nan_to_num()):
            return True
    return False


def _compare_metadata(got, want) -> str | None:
    import torch
    from torch.utils._pytree import tree_map

    on_tpu = tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, got)
    if _metadata(on_tpu) != _metadata(want):
        return f"{_metadata(on_tpu)} != {_metadata(want)}"
    return None


def worker(keys: list[str], dtype_names: list[str], out: Path) -> None:
    """Runs the ops in `keys`, appending one JSON line per (op, dtype)."""
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    by_key = {op_key(op): op for op in op_db}
    with out.open("a") as f:
        for key in keys:
            op = by_key[key]
            supported = {str(d).removeprefix("torch.") for d in op.supported_dtypes("cpu")}
            for dtype_name in dtype_names:
                if dtype_name not in supported:
                    continue
                # Written before running, so a crash names its op.
                f.write(json.dumps({"op": key, "dtype": dtype_name, "status": "started"}) + "\n")
                f.flush()
                status, detail = run_op(op, dtype_name)
                f.write(json.dumps({"op": key, "dtype": dtype_name, "status": status, "detail": detail}) + "\n")
                f.flush()


def sweep(keys: list[str], dtype_names: list[str], log: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """Runs `keys` in child processes, restarting after a crash."""
    log.write_text("")
    results: dict[tuple[str, str], tuple[str, str]] = {}
    remaining = list(keys)
    while remaining:
        subprocess.run(
            [sys.executable, __file__, "--worker", ",".join(remaining), "--dtypes", ",".join(dtype_names), "--log", str(log)],
            env=os.environ,
        )
        started = None
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            key = (entry["op"], entry["dtype"])
            if entry["status"] == "started":
                started = key
            else:
                results[key] = (entry["status"], entry.get("detail", ""))
                started = None
        done_ops = {op for op, _ in results}
        if started is not None:
            results[started] = ("error", "the process crashed")
            done_ops.add(started[0])
        last = started[0] if started else None
        remaining = [k for k in remaining if k not in done_ops and k != last]
        if started is None:
            break
    return results


def summary(results, dtype_names) -> list[str]:
    lines = []
    for dtype_name in dtype_names:
        statuses = [s for (op, d), (s, _) in results.items() if d == dtype_name and s != "skip"]
        if not statuses:
            continue
        n = len(statuses)
        passed = sum(s in ("pass", "fallback") for s in statuses)
        native = sum(s == "pass" for s in statuses)
        lines.append(
            f"| {dtype_name} | {n} | {passed} ({100 * passed / n:.1f}%) | {native} ({100 * native / n:.1f}%) |"
        )
    return lines


def write_markdown(results, dtype_names, path: Path) -> None:
    ops = sorted({op for op, _ in results})
    lines = [
        "# Op coverage: PyTorch's OpInfo database on `tpu`",
        "",
        "Generated by `tests/python/opinfo_sweep.py` (do not edit). Each OpInfo's sample",
        f"inputs (up to {MAX_SAMPLES}) run on `tpu` and on CPU and are compared with per-dtype",
        "tolerances. `pass`: matched, natively; `fallback`: matched, with some ATen op on",
        "the CPU fallback; `mismatch`; `error`; `skip`: no sample runs on CPU.",
        "",
        "| dtype | ops (CPU supports) | pass incl. fallback | pass natively |",
        "|---|---|---|---|",
        *summary(results, dtype_names),
        "",
        "| op | " + " | ".join(dtype_names) + " |",
        "|---|" + "---|" * len(dtype_names),
    ]
    for op in ops:
        cells = []
        for d in dtype_names:
            status, detail = results.get((op, d), ("—", ""))
            detail = detail.replace("|", "\\|").replace("\n", " ")[:80]
            cells.append(f"{status}" + (f" ({detail})" if status != "pass" and detail else ""))
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES))
    parser.add_argument("--out", default=str(ROOT / "docs" / "ops.md"))
    parser.add_argument("--log", default=str(ROOT / "build" / "opinfo_sweep.jsonl"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    dtype_names = args.dtypes.split(",")
    log = Path(args.log)
    if args.worker:
        worker(args.worker.split(","), dtype_names, log)
        return
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    keys = [op_key(op) for op in op_db]
    if args.ops:
        wanted = set(args.ops.split(","))
        keys = [k for k in keys if k in wanted or k.split(".")[0] in wanted]
    log.parent.mkdir(parents=True, exist_ok=True)
    results = sweep(keys, dtype_names, log)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(results, dtype_names, out)
    print("\n".join(summary(results, dtype_names)))


if __name__ == "__main__":
    main()
