"""Tensors on tpu: transfers, printing, scalars, serialisation, views, ops."""

import io

import pytest
import torch
from conftest import assert_matches_cpu

DTYPES = [
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def sample(dtype: torch.dtype, shape=(3, 4)) -> torch.Tensor:
    values = torch.arange(torch.Size(shape).numel()).reshape(shape) % 7
    if dtype.is_complex:
        return torch.complex(values.double(), -values.double()).to(dtype)
    return values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip(dtype):
    x = sample(dtype)
    y = x.to("tpu")
    assert y.device.type == "tpu" and y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y.cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16], ids=str)
def test_non_contiguous_transfers(dtype):
    x = sample(dtype, (4, 6))
    # Non-contiguous CPU source.
    assert torch.equal(x.t().tpu().cpu(), x.t())
    assert torch.equal(x[:, 1::2].tpu().cpu(), x[:, 1::2])
    # Non-contiguous tpu source.
    y = x.tpu()
    assert torch.equal(y.t().cpu(), x.t())
    assert torch.equal(y[1:, ::3].cpu(), x[1:, ::3])
    # Non-contiguous tpu target: only the view changes.
    z = torch.zeros(4, 6, dtype=dtype, device="tpu")
    z[:, ::2] = x[:, ::2]
    expected = torch.zeros(4, 6, dtype=dtype)
    expected[:, ::2] = x[:, ::2]
    assert torch.equal(z.cpu(), expected)
    # Non-contiguous CPU target.
    c = torch.empty(6, 4, dtype=dtype).t()
    c.copy_(y)
    assert torch.equal(c, x)


def test_copy_converts_dtype_and_broadcasts():
    y = torch.zeros(2, 3, dtype=torch.float64, device="tpu")
    y.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))
    assert torch.equal(y.cpu(), torch.tensor([[1.0, 2, 3], [1, 2, 3]], dtype=torch.float64))
    h = torch.empty(2, 3, dtype=torch.int64)
    h.copy_(y)
    assert torch.equal(h, torch.tensor([[1, 2, 3], [1, 2, 3]]))
    assert y.to(torch.float32).dtype == torch.float32


def test_copy_between_devices(two_devices):
    x = sample(torch.float32)
    a = x.to("tpu:0")
    b = a.to("tpu:1")
    assert b.device == torch.device("tpu:1")
    assert torch.equal(b.cpu(), x)
    assert torch.equal((b + b).cpu(), x + x)


def test_conjugate_and_negative_views_transfer():
    z = sample(torch.complex64)
    zd = z.tpu()
    assert torch.equal(zd.conj().cpu(), z.conj())
    assert torch.equal(z.conj().tpu().cpu(), z.conj())
    assert torch.equal(torch.view_as_real(zd).cpu(), torch.view_as_real(z))


def test_printing():
    t = torch.tensor([[1.5, -2.0], [3.25, 4.0]], device="tpu")
    text = repr(t)
    assert "device='tpu:0'" in text
    assert "1.5000" in text and "3.2500" in text
    assert str(torch.arange(3, device="tpu")) == "tensor([0, 1, 2], device='tpu:0')"


@pytest.mark.parametrize(
    "value, dtype",
    [(3.5, torch.float32), (-7, torch.int64), (True, torch.bool), (2.25, torch.float64), (200, torch.uint8)],
)
def test_item(value, dtype):
    t = torch.tensor(value, dtype=dtype, device="tpu")
    assert t.item() == value
    assert type(t.item()) is type(value)
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4).tpu()
    assert m[2, 1].item() == 9.0


def test_save_and_load_tensor():
    x = torch.randn(3, 4)
    buffer = io.BytesIO()
    torch.save(x.tpu(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.device == torch.device("tpu:0")
    assert torch.equal(loaded.cpu(), x)
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, x)


def test_save_and_load_state_dict():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    state = model.tpu().state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.keys() == state.keys()
    for name, value in loaded.items():
        assert value.device.type == "tpu"
        assert torch.equal(value.cpu(), state[name].cpu())
    # A CPU checkpoint mapped onto tpu, loaded into a CPU model.
    buffer = io.BytesIO()
    torch.save({k: v.cpu() for k, v in state.items()}, buffer)
    buffer.seek(0)
    mapped = torch.load(buffer, map_location="tpu")
    assert all(v.is_tpu for v in mapped.values())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    fresh.load_state_dict(mapped)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, state[name].cpu())


def test_in_place_through_views():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    xd = x.tpu()
    xd[:, 1].add_(1)
    x[:, 1].add_(1)
    assert torch.equal(xd.cpu(), x)
    y = xd.t()
    y.mul_(2)
    x.t().mul_(2)
    assert torch.equal(xd.cpu(), x)
    assert y.data_ptr() == xd.data_ptr()
    xd.view(-1)[::5].zero_()
    x.view(-1)[::5].zero_()
    assert torch.equal(xd.cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_simple_ops_match_cpu(dtype):
    torch.manual_seed(0)
    a = torch.randn(4, 5).to(dtype)
    b = torch.randn(4, 5).to(dtype)
    c = torch.randn(5, 3).to(dtype)
    ad, bd, cd = a.tpu(), b.tpu(), c.tpu()
    assert_matches_cpu(ad + bd, a + b)
    assert_matches_cpu(ad * 2, a * 2)
    assert_matches_cpu((ad @ cd).relu(), (a @ c).relu())
    assert_matches_cpu(ad.sum(1), a.sum(1))
    assert_matches_cpu(torch.softmax(ad, 1), torch.softmax(a, 1))


def test_integer_ops_match_cpu():
    a = torch.arange(-6, 6).reshape(3, 4)
    ad = a.tpu()
    assert_matches_cpu(ad * 3 - 1, a * 3 - 1)
    assert_matches_cpu(ad.abs(), a.abs())
    assert_matches_cpu(ad > 0, a > 0)
    assert_matches_cpu(ad.argmax(1), a.argmax(1))


def test_python_and_cpu_scalars():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ad = a.tpu()
    assert_matches_cpu(ad * torch.tensor(2.0), a * torch.tensor(2.0))
    assert_matches_cpu(ad + 1.5, a + 1.5)
    i = torch.ones(3, dtype=torch.int32)
    assert_matches_cpu(i.tpu() + torch.tensor(1.5, dtype=torch.float64), i + torch.tensor(1.5, dtype=torch.float64))


def test_out_argument_is_resized_and_filled():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(0, device="tpu")
    result = torch.add(a.tpu(), b.tpu(), out=out)
    assert result is out
    assert_matches_cpu(out, a + b)


def test_training_step_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    device_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    device_model.load_state_dict(model.state_dict())
    device_model.tpu()
    x, target = torch.randn(5, 4), torch.tensor([0, 2, 1, 0, 1])
    loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    device_loss = torch.nn.functional.cross_entropy(device_model(x.tpu()), target.tpu())
    device_loss.backward()
    assert_matches_cpu(device_loss, loss.detach())
    for p, q in zip(model.parameters(), device_model.parameters()):
        assert_matches_cpu(q.grad, p.grad)
    for m in (model, device_model):
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), device_model.parameters()):
        assert_matches_cpu(q.detach(), p.detach())
