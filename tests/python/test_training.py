"""An MLP trains on 'tpu' with CPU eager's loss curve (fp32, rel 1e-4),
with SGD+momentum and with AdamW; autograd's thread and Python threads."""

import threading

import pytest
import torch

import rtpu

from test_models import assert_loss_goes_down

DEVICE = "tpu"
STEPS = 20


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 10),
    )


def train(device, make_optimizer, seed):
    torch.manual_seed(seed)
    model = make_model()
    # Four fixed batches, cycled, so the loss has something to fall on.
    data = torch.randn(4, 16, 32)
    labels = torch.randint(0, 10, (4, 16))
    model = model.to(device)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        batch = step % 4
        loss = torch.nn.functional.cross_entropy(model(data[batch].to(device)), labels[batch].to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_loss_curve_matches_cpu(name):
    seed = torch.seed() % 2**31
    tpu_losses, tpu_model = train(DEVICE, OPTIMIZERS[name], seed)
    cpu_losses, cpu_model = train("cpu", OPTIMIZERS[name], seed)
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-6)
    assert_loss_goes_down(tpu_losses, 4)  # four batches
    for (n, p), (_, q) in zip(tpu_model.named_parameters(), cpu_model.named_parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-3, atol=1e-5, msg=n)


def test_state_dict_round_trips_through_torch_save(tmp_path):
    _, model = train(DEVICE, OPTIMIZERS["sgd_momentum"], 3)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    loaded = torch.load(path)
    for k, v in model.state_dict().items():
        assert loaded[k].device.type == DEVICE
        assert torch.equal(loaded[k].cpu(), v.cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert all(v.device.type == "cpu" for v in on_cpu.values())


def test_ops_from_two_threads_give_correct_results():
    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            a = torch.randn(64, 64, generator=g)
            b = torch.randn(64, 64, generator=g)
            for _ in range(10):
                got = (a.to(DEVICE) @ b.to(DEVICE)).tanh().sum(0).cpu()
                torch.testing.assert_close(got, (a @ b).tanh().sum(0), rtol=1e-4, atol=1e-4)
        except Exception as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_backward_runs_on_the_thread_that_uses_tpu():
    # Autograd hands a device's backward to a thread of its own; rtpu turns
    # that off for each thread that makes a tpu tensor, once. A thread that
    # never does keeps PyTorch's default, and turning it back on stands.
    seen = {}

    def backward_thread(x):
        threads = []
        x.register_hook(lambda grad: threads.append(threading.get_ident()))
        (x * 2).sum().backward()
        torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))
        return threads[0]

    def work():
        me = threading.get_ident()
        cpu = torch.randn(3, requires_grad=True)
        seen["cpu only"] = torch._C._is_multithreading_enabled()
        seen["cpu backward here"] = backward_thread(cpu) == me
        w = torch.randn(3, device=DEVICE, requires_grad=True)
        seen["after a tpu tensor"] = torch._C._is_multithreading_enabled()
        seen["tpu backward here"] = backward_thread(w) == me
        w.grad = None
        with rtpu.step():
            seen["tpu step backward here"] = backward_thread(w) == me
        torch.autograd.set_multithreading_enabled(True)
        w.grad = None
        seen["turned back on, autograd's thread"] = backward_thread(w) != me
        seen["still on"] = torch._C._is_multithreading_enabled()

    thread = threading.Thread(target=work, daemon=True)  # a hang fails, not blocks, the run
    thread.start()
    thread.join(timeout=60)
    assert seen == {
        "cpu only": True,
        "cpu backward here": True,
        "after a tpu tensor": False,
        "tpu backward here": True,
        "tpu step backward here": True,
        "turned back on, autograd's thread": True,
        "still on": True,
    }
