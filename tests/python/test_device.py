"""The `tpu` device itself: registration, torch.tpu, memory stats, RNG."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import rtpu
from conftest import assert_matches_cpu


def test_backend_is_registered_as_the_accelerator():
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.accelerator.device_count() == torch.tpu.device_count()


def test_tensor_module_and_storage_methods():
    t = torch.ones(2).tpu()
    assert t.is_tpu and t.device == torch.device("tpu:0")
    assert not torch.ones(2).is_tpu
    module = torch.nn.Linear(2, 3).tpu()
    assert all(p.is_tpu for p in module.parameters())
    storage = torch.UntypedStorage(8).tpu()
    assert storage.is_tpu and storage.nbytes() == 8


def test_current_device_and_context_manager(two_devices):
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(1)
    try:
        assert torch.tpu.current_device() == 1
        assert torch.empty(1, device="tpu").device == torch.device("tpu:1")
    finally:
        torch.tpu.set_device(0)
    with torch.tpu.device("tpu:1"):
        assert torch.zeros(1, device="tpu").device.index == 1
    assert torch.tpu.current_device() == 0


def test_bad_device_index_is_a_clear_error():
    count = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match="out of range"):
        torch.tpu.set_device(count)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ones(2, device=f"tpu:{count}")
    assert torch.tpu.current_device() == 0


def last_line_of(script, **env):
    """The last line `script` prints, run in a fresh Python with `env` added."""
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_rtpu_cpu_devices_sets_the_cpu_plugins_device_count():
    script = (
        "import torch, rtpu\n"
        "try:\n"
        "    x = torch.arange(3.0, device='tpu:1') * 2\n"
        "    print(torch.tpu.device_count(), x.cpu().tolist())\n"
        "except RuntimeError as e:\n"
        "    print('error:', e)\n"
    )

    def run(value):
        return last_line_of(script, RTPU_CPU_DEVICES=value)

    assert run("2") == "2 [0.0, 2.0, 4.0]"
    assert run("6") == "6 [0.0, 2.0, 4.0]"
    assert "RTPU_CPU_DEVICES must be a positive device count, got 'two'" in run("two")
    assert "RTPU_CPU_DEVICES must be a positive device count, got '0'" in run("0")


def test_synchronize_runs_what_is_pending():
    x = torch.ones(3, device="tpu")
    torch.tpu.set_execution_mode("deferred")
    try:
        for device in (None, "tpu:0", 0):
            executions = rtpu.metrics()["graph_executions"]
            x.add_(1)
            assert rtpu.metrics()["graph_executions"] == executions  # recorded, not run
            torch.tpu.synchronize(device)
            assert rtpu.metrics()["graph_executions"] == executions + 1
        assert torch.tpu.get_execution_mode() == "deferred"
    finally:
        torch.tpu.set_execution_mode("eager")
    torch.testing.assert_close(x.cpu(), torch.full((3,), 4.0))


def test_empty_cache_keeps_live_tensors_and_freed_memory_is_returned_at_once():
    before = torch.tpu.memory_allocated()
    kept = torch.arange(1000, dtype=torch.float32, device="tpu")
    freed = torch.empty(1000, dtype=torch.float32, device="tpu")
    del freed  # returned without empty_cache: rtpu keeps no cache
    assert torch.tpu.memory_allocated() == before + 4000
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == torch.tpu.memory_reserved() == before + 4000
    torch.testing.assert_close(kept.cpu(), torch.arange(1000, dtype=torch.float32))


def test_large_freed_host_blocks_are_reused_and_empty_cache_gives_them_back():
    # On the CPU plugin device memory is host memory: blocks of 4 MiB and up
    # that the plugin frees are kept for its next requests, not unmapped.
    n = 1 << 20  # 4 MiB of float32
    kept = torch.randn(n).to("tpu")
    reuses = rtpu.metrics()["host_cache_reuses"]
    for _ in range(3):
        a = torch.randn(n)  # fresh values: a reused block must not show old ones
        out = a.to("tpu") * 2 + kept
        torch.testing.assert_close(out.cpu(), a * 2 + kept.cpu(), rtol=1.3e-6, atol=1e-5)
        del out
    assert rtpu.metrics()["host_cache_reuses"] > reuses
    # The plugin may free a buffer on one of its threads a little later.
    deadline = time.monotonic() + 3
    while rtpu.metrics()["host_cache_bytes"] < 4 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rtpu.metrics()["host_cache_bytes"] >= 4 << 20
    torch.tpu.empty_cache()
    assert rtpu.metrics()["host_cache_bytes"] == 0
    assert kept.cpu().shape == (n,)


def test_rtpu_host_cache_max_bytes_caps_the_host_cache():
    # The plugin may free a buffer on one of its threads a little later:
    # wait (up to 3 s) for the blocks of the last round to come back.
    script = (
        "import time, torch, rtpu\n"
        "for _ in range(3):\n"
        "    a = torch.ones(1 << 20, device='tpu')\n"
        "    b = a * 2\n"
        "    b.cpu(); del a, b\n"
        "deadline = time.monotonic() + 3\n"
        "while rtpu.metrics()['host_cache_bytes'] < 4 << 20 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(rtpu.metrics()['host_cache_bytes'])\n"
    )

    def kept_bytes(cap):
        return int(last_line_of(script, RTPU_HOST_CACHE_MAX_BYTES=cap))

    assert kept_bytes("0") == 0  # off
    assert kept_bytes(str(5 << 20)) == 4 << 20  # room for one 4 MiB block
    assert kept_bytes(str(1 << 30)) >= 4 << 20


def test_memory_stats_follow_storages():
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    t = torch.empty(1000, dtype=torch.float32, device="tpu")
    assert torch.tpu.memory_allocated() == before + 4000
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated()
    # Results of core ops are counted too.
    u = t.fill_(1.0) * 2
    assert torch.tpu.memory_allocated() == before + 8000
    del t, u
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 8000
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before


def test_memory_stats_are_per_device_and_name_a_bad_index(two_devices):
    before = [torch.tpu.memory_stats(d) for d in range(2)]
    t = torch.empty(250, dtype=torch.float32, device="tpu:1")
    after = [torch.tpu.memory_stats(d) for d in range(2)]
    assert after[0] == before[0]
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current"):
        assert after[1][key] == before[1][key] + 1000
    for key in ("allocation.all.current", "segment.all.current", "active.all.current"):
        assert after[1][key] == before[1][key] + 1
    assert after[1]["num_device_alloc"] == before[1]["num_device_alloc"] + 1
    del t
    assert torch.tpu.memory_stats(1)["num_device_free"] == before[1]["num_device_free"] + 1
    with pytest.raises(RuntimeError, match="device index 99 is out of range"):
        torch.tpu.memory_stats(99)


def test_resize_grows_storage_and_stats():
    before = torch.tpu.memory_allocated()
    t = torch.empty(0, device="tpu")
    t.resize_(10)
    assert t.untyped_storage().nbytes() == 40
    assert torch.tpu.memory_allocated() == before + 40
    t.fill_(3.0)
    t.resize_(20)
    assert torch.equal(t[:10].cpu(), torch.full((10,), 3.0))
    assert torch.tpu.memory_allocated() == before + 80


def test_manual_seed_makes_random_ops_repeatable():
    torch.tpu.manual_seed(1234)
    first = torch.rand(8, device="tpu").cpu()
    second = torch.rand(8, device="tpu").cpu()
    torch.tpu.manual_seed(1234)
    again = torch.rand(8, device="tpu").cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, second)
    assert torch.tpu.initial_seed() == 1234
    assert ((first >= 0) & (first < 1)).all()


def test_torch_manual_seed_seeds_tpu():
    torch.manual_seed(7)
    a = torch.randn(4, device="tpu").cpu()
    torch.manual_seed(7)
    b = torch.randn(4, device="tpu").cpu()
    assert torch.equal(a, b)


def test_rng_state_round_trip():
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.randn(5, device="tpu").cpu()
    assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="generator state"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_explicit_generator():
    g = torch.Generator(device="tpu")
    g.manual_seed(99)
    a = torch.rand(3, device="tpu", generator=g).cpu()
    g.manual_seed(99)
    b = torch.rand(3, device="tpu", generator=g).cpu()
    assert torch.equal(a, b)
    clone = g.clone_state()
    assert torch.equal(
        torch.rand(3, device="tpu", generator=g).cpu(),
        torch.rand(3, device="tpu", generator=clone).cpu(),
    )


# ----- mixing devices in one op, as CUDA does ----------------------------------

SAME_DEVICE = "Expected all tensors to be on the same device, but got {arg} is on {other}, different from other tensors on tpu:0"


@pytest.mark.parametrize(
    "op, arg",
    [
        (lambda x, c: x + c, "other"),
        (lambda x, c: torch.add(c, x), "self"),
        (lambda x, c: x.mul_(c), "other"),
        (lambda x, c: x.reshape(2, 3) @ c.reshape(3, 2), "mat2"),
        (lambda x, c: torch.where(x > 0, x, c), "other"),
        (lambda x, c: torch.cat([x, c]), "tensors"),
        (lambda x, c: x.index_select(0, c.long().clamp(0, 5)), "index"),
    ],
    ids=["add", "add-cpu-first", "mul_", "matmul", "where", "cat", "index_select"],
)
def test_a_cpu_tensor_in_a_tpu_op_is_refused_as_on_cuda(op, arg):
    x = torch.randn(6, generator=torch.Generator().manual_seed(torch.seed()))
    x_tpu = x.to("tpu")
    with pytest.raises(RuntimeError, match=SAME_DEVICE.format(arg=arg, other="cpu")):
        op(x_tpu, torch.ones(6))
    assert torch.equal(x_tpu.cpu(), x)  # an in-place op wrote nothing


def test_zero_dim_cpu_tensors_are_scalars():
    x = torch.randn(2, 3)
    two = torch.tensor(2.0)
    cases = [
        lambda t: t + two,
        lambda t: two * t,
        lambda t: torch.where(t > 0, t, torch.tensor(0.0)),
        lambda t: t.masked_fill(t < 0, torch.tensor(-1.0)),
        lambda t: t.clone().add_(torch.tensor(3.0)),
        lambda t: t.clamp(min=torch.tensor(-0.5), max=torch.tensor(0.5)),
    ]
    for case in cases:
        assert_matches_cpu(case(x.to("tpu")), case(x))


def test_cpu_index_tensors_index_tpu_tensors_as_on_cuda():
    x = torch.randn(10, generator=torch.Generator().manual_seed(torch.seed()))
    index = torch.tensor([1, 3, 5])
    mask = x > 0
    assert_matches_cpu(x.to("tpu")[index], x[index])
    assert_matches_cpu(x.to("tpu")[mask], x[mask])
    values = torch.randn(3)
    for set_values in (
        lambda t, v: t.__setitem__(index, v),
        lambda t, v: t.index_put_((index,), v, accumulate=True),
    ):
        expected = x.clone()
        set_values(expected, values)
        got = x.to("tpu")
        set_values(got, values.to("tpu"))
        assert_matches_cpu(got, expected)
        # A 0-dim CPU value is a scalar there too.
        expected, got = x.clone(), x.to("tpu")
        set_values(expected, torch.tensor(7.0))
        set_values(got, torch.tensor(7.0))
        assert_matches_cpu(got, expected)
    # The values themselves must be on the device (or 0-dim).
    got = x.to("tpu")
    with pytest.raises(RuntimeError, match=SAME_DEVICE.format(arg="values", other="cpu")):
        got[index] = values
    assert torch.equal(got.cpu(), x)


def test_copies_between_cpu_and_tpu_still_take_any_cpu_tensor():
    x = torch.randn(6)
    t = torch.zeros(6, device="tpu")
    t.copy_(x)
    t[2:4] = torch.tensor([7.0, 8.0])
    expected = x.clone()
    expected[2:4] = torch.tensor([7.0, 8.0])
    assert torch.equal(t.cpu(), expected)


def test_a_tensor_on_another_tpu_device_is_refused(two_devices):
    a = torch.ones(3, device="tpu:0")
    with pytest.raises(RuntimeError, match=SAME_DEVICE.format(arg="other", other="tpu:1")):
        a + torch.ones(3, device="tpu:1")


# ----- torch.tpu as torch.cuda: properties, memory, streams, events ----------


def test_device_name_and_properties_come_from_the_plugin():
    kind, _, cores = torch.ops.rtpu.device_info(0)
    props = torch.tpu.get_device_properties(0)
    assert props.name == kind == torch.tpu.get_device_name() == torch.tpu.get_device_name("tpu:0") != ""
    assert props.platform == torch.ops.rtpu.platform_name()
    assert props.total_memory == torch.tpu.mem_get_info(0)[1] > 0
    # The CPU plugin reports no core count: its devices share the host's CPUs.
    assert cores == -1 and props.multi_processor_count == os.cpu_count()
    assert torch.tpu.get_device_properties(torch.device("tpu")) == props
    with pytest.raises(RuntimeError, match="out of range"):
        torch.tpu.get_device_properties(torch.tpu.device_count())


def test_mem_get_info_counts_what_tpu_tensors_hold():
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert free + torch.tpu.memory_allocated() <= total
    # torch.accelerator asks the same allocator. Free memory is the host's
    # on the CPU plugin, which other processes change between two reads,
    # so only the total can be compared exactly.
    accelerator_free, accelerator_total = torch.accelerator.get_memory_info(0)
    assert accelerator_total == total and 0 < accelerator_free <= total


def test_memory_summary_shows_the_current_allocation():
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    t = torch.empty(256 * 1024, dtype=torch.float32, device="tpu")  # 1 MiB
    summary = torch.tpu.memory_summary()
    row = next(line for line in summary.splitlines() if line.startswith("Allocated memory"))
    # "Allocated memory", then current and peak values, each a number and a unit.
    fields = row.split()
    expected = rtpu.tpu._format_bytes(before + t.nbytes)
    assert " ".join(fields[2:4]) == expected == " ".join(fields[4:6])
    assert summary == torch.tpu.memory_summary(0, abbreviated=True)


def test_bf16_is_supported():
    assert torch.tpu.is_bf16_supported()
    x = torch.randn(8, 8)
    assert_matches_cpu(x.bfloat16().to("tpu") @ x.bfloat16().to("tpu"), x.bfloat16() @ x.bfloat16())


def test_rng_state_of_every_device_round_trips(two_devices):
    torch.tpu.manual_seed_all(torch.seed())
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count()
    first = [torch.rand(4, device=f"tpu:{i}").cpu() for i in (0, 1)]
    torch.tpu.set_rng_state_all(states)
    assert all(torch.equal(torch.rand(4, device=f"tpu:{i}").cpu(), first[i]) for i in (0, 1))
    torch.tpu.manual_seed_all(5)
    again = [torch.rand(4, device=f"tpu:{i}").cpu() for i in (0, 1)]
    torch.tpu.manual_seed_all(5)
    assert all(torch.equal(torch.rand(4, device=f"tpu:{i}").cpu(), again[i]) for i in (0, 1))


def test_streams_are_current_per_thread_and_per_block():
    default = torch.tpu.default_stream()
    assert default.stream_id == 0 and torch.tpu.current_stream() == default
    assert torch.accelerator.current_stream() == default
    s, t = torch.tpu.Stream(), torch.tpu.Stream(priority=-1)
    assert isinstance(s, torch.Stream) and s != t and s.device == torch.device("tpu:0")
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s == torch.accelerator.current_stream()
        with torch.tpu.stream(t):
            assert torch.tpu.current_stream() == t
        assert torch.tpu.current_stream() == s
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.tpu.current_stream()))
        thread.start()
        thread.join()
        assert seen == [default]
    with torch.tpu.stream(None):
        assert torch.tpu.current_stream() == default
    torch.tpu.set_stream(t)
    try:
        assert torch.tpu.current_stream() == t
    finally:
        torch.tpu.set_stream(default)
    assert torch.tpu.current_stream() == default


def test_a_stream_of_another_device_is_current_there(two_devices):
    s = torch.tpu.Stream("tpu:1")
    with torch.tpu.stream(s):
        assert torch.tpu.current_device() == 1 and torch.tpu.current_stream() == s
        assert torch.ones(1, device="tpu").device == torch.device("tpu:1")
    assert torch.tpu.current_device() == 0
    assert torch.tpu.current_stream(1).stream_id == 0


def heavy_work(x: torch.Tensor, steps: int = 20) -> torch.Tensor:
    """A chain of matmuls, each waiting for the last: about a second of
    device work on the CPU plugin, launched in a fraction of that."""
    y = x
    for _ in range(steps):
        y = (y @ x).tanh()
    return y


def test_events_mark_the_device_work_and_time_it():
    x = torch.randn(1024, 1024, device="tpu") / 32
    heavy_work(x, 1)  # compiled before anything is timed
    torch.tpu.synchronize()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert isinstance(start, torch.tpu.Event) and start.query()  # marks no work yet
    t0 = time.perf_counter()
    start.record()
    t_recorded = time.perf_counter()
    y = heavy_work(x)
    end.record()
    # The work runs after its launch: query says so until it is done.
    last_running = None
    while True:
        asked = time.perf_counter()
        if end.query():
            break
        last_running = asked
        time.sleep(0.001)
    assert last_running is not None, "the work was done when it was launched"
    end.synchronize()
    t1 = time.perf_counter()
    assert end.query() and start.query()
    elapsed = start.elapsed_time(end)
    # From the start mark (done when recorded) to the end of the work: at
    # least until the last time it was seen running, within the host's span.
    assert (last_running - t_recorded) * 1e3 <= elapsed <= (t1 - t0) * 1e3
    assert_matches_cpu(y, heavy_work(x.cpu()))
    untimed = torch.tpu.Event()
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        start.elapsed_time(untimed)


def test_event_synchronize_waits_for_the_marked_work_only():
    x = torch.randn(1024, 1024, device="tpu") / 32
    heavy_work(x, 1)
    torch.tpu.synchronize()
    before = torch.tpu.Event()
    before.record()
    heavy_work(x)
    after = torch.tpu.Event()
    after.record()
    before.synchronize()
    assert before.query() and not after.query()
    after.synchronize()
    assert after.query()
    # A stream is done when all its device's work is.
    assert torch.tpu.current_stream().query()


def test_synchronize_waits_for_eager_work():
    x = torch.randn(1024, 1024, device="tpu") / 32
    heavy_work(x, 1)
    y = heavy_work(x)
    torch.tpu.synchronize()
    nothing_left = torch.tpu.Event()
    nothing_left.record()
    assert nothing_left.query()
    assert torch.tpu.current_stream().query()
    assert_matches_cpu(y, heavy_work(x.cpu()))


def test_stream_and_event_calls_of_fsdp2_order_the_work():
    # The calls torch.distributed.fsdp.fully_shard makes, on real work.
    device = torch.device("tpu", torch.tpu.current_device())
    copy_in = torch.tpu.Stream(priority=-1)
    gather = torch.tpu.Stream(priority=-1)
    x = torch.randn(64, 64)
    current = torch.tpu.current_stream()
    copy_in.wait_stream(current)
    with torch.tpu.stream(copy_in):
        staged = x.to(device) * 2
    gather.wait_stream(copy_in)
    with torch.tpu.stream(gather):
        gathered = staged @ staged
        event = gather.record_event()
    current.wait_event(event)
    torch.accelerator.current_stream().wait_event(event)
    done = torch.tpu.Event()
    done.record()
    done.synchronize()
    assert done.query() and event.query()
    assert_matches_cpu(gathered, (x * 2) @ (x * 2))
