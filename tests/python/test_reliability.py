"""Defects a user hits without trying hard, each held by a test: device
buffers left by changing scalars, a disk cache that trusted its bytes and
its directory, a forked child that hung, and sizes past the device that
crashed the process. Whatever could kill the test runner runs in a
subprocess."""

import gc
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch

import rtpu
from conftest import twins
from test_step import mse_steps
from training import train_step

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
        # A new learning rate, and new bias corrections, every step.
        mse_steps(model, optimizer, x, y, count, schedule)

    # Compiles, creates Adam's state and fills rtpu's cache of repeated
    # scalars, which then keeps its size.
    steps(100)
    assert live_buffers_after(lambda: steps(300)) == 0


CACHE_SCRIPT = """
import json, torch, rtpu
values = [(torch.arange(n, dtype=torch.float32).to("tpu").exp() * 2).sum().item() for n in (3, 4, 5, 6)]
m = rtpu.metrics()
print(json.dumps(dict(values=values, compiled=m["executables_compiled"], disk_hits=m["disk_cache_hits"],
                      info=rtpu.cache_info())))
"""
CACHE_VALUES = [(torch.arange(n, dtype=torch.float32).exp() * 2).sum().item() for n in (3, 4, 5, 6)]


def run_cache_script(cache_dir, **env):
    done = subprocess.run(
        [sys.executable, "-c", CACHE_SCRIPT],
        env=dict(os.environ, RTPU_CACHE_DIR=str(cache_dir), **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["values"] == pytest.approx(CACHE_VALUES, rel=1e-6)
    return result, done.stderr


def test_the_disk_cache_is_private_and_its_entries_checked(tmp_path):
    cache = tmp_path / "cache"
    first, _ = run_cache_script(cache)
    entries = sorted(cache.glob("*.xla"))
    assert first["compiled"] == len(entries) > 0
    assert first["info"] == {"dir": str(cache), "entries": len(entries), "bytes": sum(e.stat().st_size for e in entries),
                             "max_bytes": 2**30}
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert {stat.S_IMODE(e.stat().st_mode) for e in entries} == {0o600}

    # A flipped bit, a truncated file and another program's entry: each is
    # found before it reaches the plugin, recompiled and rewritten.
    flipped, truncated, swapped = entries[0], entries[1], entries[2]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:100])
    swapped.write_bytes(entries[3].read_bytes())
    second, stderr = run_cache_script(cache)
    assert stderr.count("is corrupt") == 3, stderr
    assert "checksum does not match" in stderr and "truncated" in stderr and "another program" in stderr
    assert (second["compiled"], second["disk_hits"]) == (3, len(entries) - 3)
    third, stderr = run_cache_script(cache)
    assert "corrupt" not in stderr and (third["compiled"], third["disk_hits"]) == (0, len(entries))


def test_the_disk_cache_misses_under_other_xla_flags(tmp_path):
    # XLA_FLAGS change what XLA compiles (fast math, ISA, passes): an entry
    # compiled under other flags is not the program these flags ask for.
    cache = tmp_path / "cache"
    plain, _ = run_cache_script(cache, XLA_FLAGS="")
    flagged, _ = run_cache_script(cache, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert flagged["compiled"] == plain["compiled"] > 0 and flagged["disk_hits"] == 0
    again, _ = run_cache_script(cache, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert (again["compiled"], again["disk_hits"]) == (0, plain["compiled"])


def test_the_disk_cache_keeps_to_its_size_cap(tmp_path):
    cache = tmp_path / "cache"
    uncapped, _ = run_cache_script(cache)
    sizes = sorted(e.stat().st_size for e in cache.glob("*.xla"))
    cap = sum(sizes[:2])  # room for about two entries
    shutil.rmtree(cache)
    capped, _ = run_cache_script(cache, RTPU_CACHE_MAX_BYTES=str(cap))
    held = list(cache.glob("*.xla"))
    assert capped["compiled"] == uncapped["compiled"]
    assert 0 < sum(e.stat().st_size for e in held) <= cap
    assert capped["info"]["entries"] == len(held) < uncapped["info"]["entries"]


MEMORY_CAP_SCRIPT = """
import json, torch, rtpu
def run(n):
    x = torch.arange(n, dtype=torch.float32, device="tpu")
    return (x * 2 + 1).sum().item()
def compiled():
    return rtpu.metrics()["executables_compiled"]
first = [run(n) for n in range(1, 13)]
before = compiled()
again = [run(n) for n in range(1, 13)]
# Eager plans whose programs were evicted (run(5) made them) give way to
# new ones: two ops, within the cap, replay from their second call on.
x = torch.arange(5, dtype=torch.float32, device="tpu")
replayed = rtpu.metrics()["ops_replayed"]
last = [(x * 2).sum().item() for _ in range(4)]
print(json.dumps({"right": first == again == [float(n * n) for n in range(1, 13)] and last == [20.0] * 4,
                  "recompiled": compiled() - before, "evicted": rtpu.metrics()["executables_evicted"],
                  "replayed": rtpu.metrics()["ops_replayed"] - replayed}))
"""


def test_the_memory_cache_keeps_to_its_entry_cap():
    def run(**env):
        done = subprocess.run([sys.executable, "-c", MEMORY_CAP_SCRIPT], capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, RTPU_CACHE_DIR="", **env))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    uncapped, capped = run(), run(RTPU_MEMORY_CACHE_ENTRIES="4")
    assert uncapped["replayed"] > 0
    assert {k: uncapped[k] for k in ("right", "recompiled", "evicted")} == {"right": True, "recompiled": 0, "evicted": 0}
    # Each size compiled a few programs; past the cap, the second pass compiles them again.
    assert capped["right"] and capped["recompiled"] > 0 and capped["evicted"] >= capped["recompiled"]
    assert capped["replayed"] > 0


def test_clear_cache_empties_it(tmp_path):
    cache = tmp_path / "cache"
    run_cache_script(cache)
    script = "import torch, rtpu; print(rtpu.clear_cache(), rtpu.cache_info()['entries'])"
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, RTPU_CACHE_DIR=str(cache)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    removed, left = map(int, done.stdout.split())
    assert removed > 0 and left == 0 and not list(cache.glob("*.xla"))


def test_a_cache_dir_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 12345, 12345)
    result, stderr = run_cache_script(cache)
    assert "not using the compile cache" in stderr and "owned by user 12345" in stderr, stderr
    assert result["info"]["dir"] is None and not list(cache.iterdir())


def test_a_cache_dir_others_could_write_is_made_private(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    result, _ = run_cache_script(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and result["info"]["entries"] > 0


FORK_SCRIPT = """
import os, torch
x = torch.ones(2, device="tpu") + 1  # the parent opens the runtime
pid = os.fork()
if pid == 0:
    try:
        torch.ones(2, device="tpu")
        os._exit(3)
    except RuntimeError as e:
        os._exit(0 if "forked subprocess" in str(e) and "spawn" in str(e) else 4)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), (x + 1).cpu().tolist())
"""

SPAWN_SCRIPT = """
import torch
import torch.multiprocessing as mp


def work(queue):
    queue.put((torch.arange(3.0, device="tpu") * 2).cpu().tolist())


if __name__ == "__main__":
    x = torch.ones(2, device="tpu")  # the parent uses tpu too
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=work, args=(queue,))
    child.start()
    print("child", queue.get(timeout=240), (x + 1).cpu().tolist())
    child.join()
"""


def test_a_forked_child_that_touches_tpu_gets_a_clear_error_and_spawn_works(tmp_path):
    forked = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0, forked.stderr
    assert "child 0 [3.0, 3.0]" in forked.stdout, forked.stdout + forked.stderr
    script = tmp_path / "spawn_child.py"
    script.write_text(SPAWN_SCRIPT)
    spawned = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert spawned.returncode == 0, spawned.stderr
    assert "child [0.0, 2.0, 4.0] [2.0, 2.0]" in spawned.stdout, spawned.stdout


HUGE_SCRIPT = """
import torch
attempts = {
    "empty": lambda: torch.empty(2**40, device="tpu"),
    "expand": lambda: torch.zeros(1, device="tpu").expand(2**31, 2**31).sum(),
    "resize": lambda: torch.ones(3, device="tpu").resize_(2**40),
}
allocated = torch.tpu.memory_allocated()
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "no error")
    except torch.OutOfMemoryError as e:
        print(name, "out of memory", "bytes of tpu:0" in str(e))
print("allocated", torch.tpu.memory_allocated() - allocated)
print("after", (torch.ones(3, device="tpu") * 2).cpu().tolist())
"""


def test_sizes_past_the_device_are_out_of_memory_errors_and_the_process_goes_on():
    done = subprocess.run([sys.executable, "-c", HUGE_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name in ("empty", "expand", "resize"):
        assert f"{name} out of memory True" in done.stdout, done.stdout + done.stderr
    assert "allocated 0" in done.stdout and "after [2.0, 2.0, 2.0]" in done.stdout, done.stdout


def test_writing_through_an_expanded_view_is_refused_as_on_cpu_but_fill_works():
    for device in ("cpu", "tpu"):
        x = torch.zeros(1, device=device)
        # Eagerly and in a step: a 2^31-element scatter once aborted the process.
        with pytest.raises(RuntimeError, match="single memory location" if device == "cpu" else "appears twice"):
            x.expand(2**31, 1).add_(1)
    with pytest.raises(RuntimeError, match="appears twice"):
        with rtpu.step():
            torch.ones(3, device="tpu").expand(2, 3).mul_(2)
    x = torch.zeros(2, 3, device="tpu")
    x[1].expand(2**40, 3).fill_(2.5)
    x[0].expand(4, 3).zero_()
    assert x.cpu().tolist() == [[0.0] * 3, [2.5] * 3]


def classifier_step(model, optimizer, x, target):
    """One training step of `model` on (x, target) as one program; the
    target is computed inside it, so its range is checked on the device."""
    with rtpu.step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), target + 0)
        loss.backward()
        optimizer.step()
    return loss


def classifier(classes):
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))


def assert_unchanged(model, optimizer, state, optimizer_state):
    """The model's weights and the optimizer's tpu buffers hold the bytes of
    `state` and `optimizer_state` (their copies from before a failed step)."""
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.cpu(), state[name], rtol=0, atol=0, msg=name)
    for kept, s in zip(optimizer_state, optimizer.state.values()):
        for k, v in kept.items():
            torch.testing.assert_close(s[k].cpu(), v, rtol=0, atol=0, msg=k)


def assert_next_step_trains_as_cpu(cpu, tpu, x, y):
    """One more step of (model, optimizer) on the CPU and of (model,
    optimizer, step function) on tpu gives the same loss and weights."""
    (model_cpu, optimizer_cpu), (model, optimizer, tpu_step) = cpu, tpu
    loss_cpu = train_step(model_cpu, optimizer_cpu, x, y)
    loss = tpu_step(model, optimizer, x.to(DEVICE), y.to(DEVICE))
    torch.testing.assert_close(loss.cpu(), loss_cpu.detach(), rtol=1e-5, atol=1e-6)
    for (name, value), expected in zip(model.state_dict().items(), model_cpu.state_dict().values()):
        torch.testing.assert_close(value.cpu(), expected, rtol=1e-5, atol=1e-6, msg=name)


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
}


@pytest.mark.parametrize("optimizer_name", OPTIMIZERS)
@pytest.mark.parametrize("runner", ["step", "compiled"])
def test_a_step_failing_a_device_check_keeps_the_old_weights_and_the_next_step_trains(runner, optimizer_name):
    seed = torch.seed()
    print("seed", seed)
    classes = 5
    model_cpu, model = twins(lambda: classifier(classes))
    make_optimizer = OPTIMIZERS[optimizer_name]
    optimizer_cpu, optimizer = make_optimizer(model_cpu.parameters()), make_optimizer(model.parameters())
    # In a step the target is checked on the device when computed there; a
    # compiled step checks every index on the device.
    tpu_step = classifier_step if runner == "step" else torch.compile(train_step, backend="tpu")
    x = torch.randn(4, 8)
    good = torch.randint(0, classes, (4,))
    for _ in range(2):  # optimizer state exists before the failing step
        train_step(model_cpu, optimizer_cpu, x, good)
        tpu_step(model, optimizer, x.to(DEVICE), good.to(DEVICE))
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    optimizer_state = [{k: v.cpu() for k, v in s.items() if torch.is_tensor(v) and v.device.type == DEVICE}
                       for s in optimizer.state.values()]
    host_steps = [s["step"].clone() for s in optimizer.state.values()
                  if "step" in s and s["step"].device.type == "cpu"]

    bad = good.clone()
    bad[2] = classes  # one class past the last
    with pytest.raises(RuntimeError, match=r"class indices in \[0, 5\).*found on the device"):
        tpu_step(model, optimizer, x.to(DEVICE), bad.to(DEVICE)).item()
    # Nothing the failed step would have written changed: weights, biases and
    # the optimizer's buffers hold their old bytes.
    assert_unchanged(model, optimizer, state, optimizer_state)
    # The model can be saved, and the next step trains as on CPU, whose
    # optimizer never saw the failed step (a step counter on the host is not
    # rtpu's to keep, so the test winds it back).
    torch.save(model.state_dict(), os.devnull)
    for s, step in zip((s for s in optimizer.state.values() if "step" in s and s["step"].device.type == "cpu"), host_steps):
        s["step"].copy_(step)
    assert_next_step_trains_as_cpu((model_cpu, optimizer_cpu), (model, optimizer, tpu_step), x, good)


def test_compiled_steps_launched_after_a_failed_check_are_undone_with_it():
    """A compiled step's replays do not wait for earlier checks, so the host
    launches more steps before anyone reads a value. Those steps see the
    failed check's flag and keep every value too; the next host read raises
    the check's error, and training goes on from the last good step."""
    seed = torch.seed()
    print("seed", seed)
    classes = 5
    model_cpu, model = twins(lambda: classifier(classes))
    optimizer_cpu = torch.optim.AdamW(model_cpu.parameters(), lr=0.01)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, capturable=True)
    tpu_step = torch.compile(train_step, backend="tpu")
    x = torch.randn(4, 8)
    good = torch.randint(0, classes, (4,))
    bad = good.clone()
    bad[1] = -1
    for _ in range(2):
        train_step(model_cpu, optimizer_cpu, x, good)
        tpu_step(model, optimizer, x.to(DEVICE), good.to(DEVICE))
    torch.tpu.synchronize()
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    optimizer_state = [{k: v.cpu() for k, v in s.items()} for s in optimizer.state.values()]

    failed = tpu_step(model, optimizer, x.to(DEVICE), bad.to(DEVICE))
    after = tpu_step(model, optimizer, x.to(DEVICE), good.to(DEVICE))
    with pytest.raises(RuntimeError, match=r"class indices in \[0, 5\).*found on the device"):
        after.item()
    for loss in (failed, after):  # both steps' losses hold the error
        with pytest.raises(RuntimeError, match=r"class indices in \[0, 5\)"):
            loss.item()
    assert_unchanged(model, optimizer, state, optimizer_state)
    # CPU never took the two steps; the next one trains as CPU's third.
    assert_next_step_trains_as_cpu((model_cpu, optimizer_cpu), (model, optimizer, tpu_step), x, good)


def test_a_value_a_failed_graph_made_stays_an_error_after_a_chained_graph_updates_it():
    """A compiled graph that updates in place a value an unchecked graph
    made keeps that value when the check fails: the value is the check's
    error then, never the clamped gather's numbers."""
    x_cpu = torch.randn(5, 3)
    x = x_cpu.to(DEVICE)
    gather = torch.compile(lambda x, i: x[i] * 2, backend="tpu")
    bump = torch.compile(lambda z: z.add_(1), backend="tpu")
    good, bad = torch.tensor([0, 4]), torch.tensor([0, 5])
    for _ in range(2):  # captured, then replayed
        z = bump(gather(x, good.to(DEVICE)))
        torch.testing.assert_close(z.cpu(), x_cpu[good] * 2 + 1, rtol=0, atol=0)
    z = gather(x, bad.to(DEVICE))
    bump(z)
    for _ in range(2):  # the check's error, then the value that is that error
        with pytest.raises(RuntimeError, match=r"aten::index.*expected indices in \[-5, 5\).*found on the device"):
            z.cpu()
    torch.testing.assert_close(x.cpu(), x_cpu, rtol=0, atol=0)


PARTIAL_READS_RIGHT_AFTER_LAUNCH = """
import torch
a, b = torch.randn(512, 512), torch.randn(512, 512)
expected = a @ b
a, b = a.to("tpu"), b.to("tpu")
for i in range(100):
    product = a @ b  # launched, not waited for
    torch.testing.assert_close(product[i, :8].cpu(), expected[i, :8], rtol=1e-4, atol=1e-4)
print("ok")
"""


def test_a_partial_read_waits_for_the_program_still_writing_the_value():
    # The raw copy of part of a buffer (below) crashed the process when the
    # program making the buffer was still running; a process of its own.
    done = subprocess.run([sys.executable, "-c", PARTIAL_READS_RIGHT_AFTER_LAUNCH], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_reading_a_few_elements_of_a_large_tensor_copies_only_those():
    rows, columns = 4096, 4096  # 64 MiB of float32
    x_cpu = torch.randn(rows, columns)
    x = x_cpu.to(DEVICE) * 2  # a buffer a program made, with no host copy
    torch.tpu.synchronize()
    compiled = rtpu.metrics()["executables_compiled"]

    def read(view):
        before = rtpu.metrics()["device_to_host_bytes"]
        value = view.cpu()
        return value, rtpu.metrics()["device_to_host_bytes"] - before

    row, copied = read(x[1000, 10:20])
    torch.testing.assert_close(row, x_cpu[1000, 10:20] * 2, rtol=0, atol=0)
    assert copied == 10 * 4
    block, copied = read(x[7:9, 100:103])  # spans 2 rows: from (7, 100) to (8, 102)
    torch.testing.assert_close(block, x_cpu[7:9, 100:103] * 2, rtol=0, atol=0)
    assert copied == (columns + 3) * 4
    assert read(x[-1, -1])[0].item() == x_cpu[-1, -1].item() * 2
    # Any view, read as any dtype, copies the span it needs: the CPU plugin
    # keeps its buffers dense, so a read takes their raw bytes with no
    # program (a tiled layout would slice on the device, a compile per
    # range).
    _, copied = read(x[::2, 0])
    assert copied == ((rows - 2) * columns + 1) * 4
    bits, copied = read(x.view(torch.int32)[3, :4])
    assert torch.equal(bits, (x_cpu * 2).view(torch.int32)[3, :4]) and copied == 4 * 4
    diagonal = range(0, rows, 512)
    assert [x[i, i].item() for i in diagonal] == [x_cpu[i, i].item() * 2 for i in diagonal]
    assert rtpu.metrics()["executables_compiled"] == compiled
