"""Fused optimizers (`fused=True`: Adam, AdamW, SGD) and GradScaler's ops
run natively on tpu, in eager and step mode, with the weights of the same
fused optimizer on the CPU; no CPU fallback."""

import pytest
import torch
import torch.nn.functional as F

import rtpu
from conftest import twins

DEVICE = "tpu"
# Float32 rounding in another order over 5 steps (Adam's division by
# sqrt(v) + eps amplifies it): measured ≤ 1.1e-6 absolute and 4.1e-5
# relative (7 optimizers x 3 seeds); margin ~5-10x.
WEIGHTS_TOLERANCE = {"rtol": 2e-4, "atol": 1e-5}
# Adam divides by sqrt(v) + eps: where a weight's gradient sum cancels to
# near zero, rounding in another order changes its update by up to the
# learning rate. Measured over 600 fresh models per Adam variant and mode:
# 1-2 such weights in about 1 tensor in 1000, off by at most 1.3e-3; every
# other weight within WEIGHTS_TOLERANCE. So a few weights per tensor may
# be off by up to one step (lr = 1e-2), no more.
ADAM_OUTLIER_BOUND = 1e-2

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.01, fused=True),
    "adam-amsgrad-maximize": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, maximize=True, fused=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw-tensor-lr": lambda p: torch.optim.AdamW(p, lr=torch.tensor(1e-2), fused=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, fused=True),
    "sgd-momentum-nesterov": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, fused=True
    ),
    "sgd-momentum-dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, fused=True),
}


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def twin_mlps():
    """The same fresh MLP on the CPU and on tpu."""
    torch.manual_seed(torch.seed())
    return twins(mlp)


def assert_weights_close(got, want, key, adam):
    """`got` (tpu) holds `want`'s weights within WEIGHTS_TOLERANCE; after an
    Adam variant, up to max(2, 1%) of them may be off by ADAM_OUTLIER_BOUND."""
    got = got.cpu()
    if not adam:
        torch.testing.assert_close(got, want, **WEIGHTS_TOLERANCE, msg=key)
        return
    assert got.shape == want.shape and got.dtype == want.dtype, key
    diff = (got - want).abs()
    # Negated comparisons count a NaN as off.
    off = ~(diff <= WEIGHTS_TOLERANCE["atol"] + WEIGHTS_TOLERANCE["rtol"] * want.abs())
    allowed = max(2, want.numel() // 100)
    assert int(off.sum()) <= allowed, f"{key}: {int(off.sum())} weights off by more than {WEIGHTS_TOLERANCE}"
    assert not (~(diff <= ADAM_OUTLIER_BOUND)).any(), f"{key}: a weight off by {diff.max()}"


def train(model, optimizer, device, steps, step_mode):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        if step_mode:
            with rtpu.step():
                optimizer.zero_grad()
                F.mse_loss(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
        else:
            optimizer.zero_grad()
            F.mse_loss(model(x.to(device)), y.to(device)).backward()
            optimizer.step()


@pytest.mark.parametrize("step_mode", [False, True], ids=["eager", "step"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_fused_optimizer_runs_natively_with_the_cpus_weights(name, step_mode):
    model_cpu, model = twin_mlps()
    fallbacks = dict(rtpu.metrics()["cpu_fallbacks"])
    train(model_cpu, OPTIMIZERS[name](model_cpu.parameters()), "cpu", 5, False)
    train(model, OPTIMIZERS[name](model.parameters()), DEVICE, 5, step_mode)
    assert rtpu.metrics()["cpu_fallbacks"] == fallbacks
    for (key, got), want in zip(model.state_dict().items(), model_cpu.state_dict().values()):
        assert_weights_close(got, want, key, adam=name.startswith("adam"))


def test_grad_scaler_with_a_fused_optimizer_runs_natively_and_skips_inf_steps():
    model_cpu, model = twin_mlps()
    fallbacks = dict(rtpu.metrics()["cpu_fallbacks"])
    results = {}
    for device, m in (("cpu", model_cpu), (DEVICE, model)):
        optimizer = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
        g = torch.Generator().manual_seed(1)
        scales = []
        for step in range(6):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            loss = F.mse_loss(m(x.to(device)), y.to(device))
            if step == 3:
                loss = loss * float("inf")  # skipped; the scale backs off
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scales.append(scaler.get_scale())
        results[device] = scales
    assert rtpu.metrics()["cpu_fallbacks"] == fallbacks
    assert results[DEVICE] == results["cpu"], results
    for (key, got), want in zip(model.state_dict().items(), model_cpu.state_dict().values()):
        assert_weights_close(got, want, key, adam=True)
