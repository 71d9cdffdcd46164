"""The `tpu` device itself: registration, torch.tpu, memory stats, RNG."""

import pytest
import torch

import rtpu


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
