"""torch.autocast("tpu"): CUDA's policy per op family, values against the
CPU computing the same ops in the dtypes the policy picks, training with
bfloat16 autocast and with float16 and GradScaler, and
torch.utils.checkpoint."""

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

from conftest import TOLERANCES, twins

DEVICE = "tpu"


def fresh(*shape):
    return torch.randn(*shape)


# (name, op on inputs, inputs' shapes, the dtype CUDA's policy gives under
# autocast to LOW, with LOW the autocast dtype).
LOW = "low"
POLICY = [
    ("mm", lambda a, b: torch.mm(a, b), [(4, 8), (8, 3)], LOW),
    ("matmul", lambda a, b: a @ b, [(2, 4, 8), (8, 3)], LOW),
    ("bmm", lambda a, b: torch.bmm(a, b), [(2, 4, 8), (2, 8, 3)], LOW),
    ("linear", lambda a, w: F.linear(a, w), [(4, 8), (3, 8)], LOW),
    ("addmm", lambda c, a, b: torch.addmm(c, a, b), [(4, 3), (4, 8), (8, 3)], LOW),
    ("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b), [(2, 4, 3), (2, 4, 8), (2, 8, 3)], LOW),
    ("conv2d", lambda x, w: F.conv2d(x, w), [(1, 2, 6, 6), (3, 2, 3, 3)], LOW),
    ("softmax", lambda x: torch.softmax(x, -1), [(4, 8)], torch.float32),
    ("log_softmax", lambda x: torch.log_softmax(x, -1), [(4, 8)], torch.float32),
    ("layer_norm", lambda x: F.layer_norm(x, (8,)), [(4, 8)], torch.float32),
    ("mse_loss", lambda a, b: F.mse_loss(a, b), [(4, 8), (4, 8)], torch.float32),
    ("exp", torch.exp, [(4, 8)], torch.float32),
    ("sum", torch.sum, [(4, 8)], torch.float32),
    ("cumsum", lambda x: torch.cumsum(x, 0), [(4, 8)], torch.float32),
    ("addcmul", lambda a, b, c: torch.addcmul(a, b, c), [(4, 8), (4, 8), (4, 8)], "widest"),
]


def cpu_as_policy(op, inputs, dtype):
    """The op on the CPU, its inputs cast as the policy casts them."""
    return op(*(x.to(dtype) for x in inputs))


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", [p[0] for p in POLICY])
def test_each_op_family_gets_cudas_autocast_dtype_and_the_cpus_values(name, low):
    _, op, shapes, policy = next(p for p in POLICY if p[0] == name)
    inputs = [fresh(*s) for s in shapes]
    if policy == "widest":
        # A promoting op given mixed dtypes runs in the widest of them.
        inputs[1] = inputs[1].to(low)
    with torch.autocast(DEVICE, dtype=low):
        got = op(*(x.to(DEVICE) for x in inputs))
    want_dtype = {LOW: low, "widest": torch.float32}.get(policy, policy)
    assert got.dtype == want_dtype, f"{name}: {got.dtype}"
    want = cpu_as_policy(op, inputs, want_dtype if policy != "widest" else torch.float32)
    # Computed in `want_dtype`; matmuls accumulate in another order.
    tolerance = TOLERANCES[want_dtype]
    if want_dtype != torch.float32:
        tolerance = {"rtol": 2 * tolerance["rtol"], "atol": 4 * tolerance["atol"]}
    torch.testing.assert_close(got.cpu(), want, **tolerance)


def test_autocast_defaults_to_bfloat16_and_knows_its_dtypes():
    assert torch.get_autocast_dtype(DEVICE) == torch.bfloat16
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    x = torch.randn(4, 8, device=DEVICE)
    with torch.autocast(DEVICE):
        assert torch.is_autocast_enabled(DEVICE)
        assert (x @ x.t()).dtype == torch.bfloat16
    assert (x @ x.t()).dtype == torch.float32


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def test_bfloat16_autocast_training_follows_the_cpus_loss_curve():
    seed = torch.seed()
    print("seed", seed)
    model_cpu, model = twins(mlp)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model_cpu, model)]
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    losses = {"cpu": [], DEVICE: []}
    for _ in range(10):
        for device, m, optimizer in (("cpu", model_cpu, optimizers[0]), (DEVICE, model, optimizers[1])):
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = F.mse_loss(m(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[device].append(loss.item())
    # Both run the linears in bfloat16 (CPU's policy agrees for linear and
    # mse_loss): measured ≤ 1.1e-3 relative over 6 seeds; margin ~10x.
    torch.testing.assert_close(torch.tensor(losses[DEVICE]), torch.tensor(losses["cpu"]), rtol=1e-2, atol=1e-3)
    assert losses[DEVICE][-1] < losses[DEVICE][0]


def test_float16_with_grad_scaler_trains_and_skips_a_step_with_inf():
    torch.manual_seed(torch.seed())
    model = mlp().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=2.0**10)
    x, y = torch.randn(32, 16, device=DEVICE), torch.randn(32, 4, device=DEVICE)
    losses = []
    for _ in range(8):
        with torch.autocast(DEVICE, dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    # An inf gradient: the step is skipped and the scale halves.
    weights = [p.detach().cpu() for p in model.parameters()]
    scale = scaler.get_scale()
    optimizer.zero_grad()
    with torch.autocast(DEVICE, dtype=torch.float16):
        loss = F.mse_loss(model(x).float(), y) * float("inf")
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == scale / 2
    for before, p in zip(weights, model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), before, rtol=0, atol=0)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_gives_the_gradients_of_the_plain_model(reentrant):
    torch.manual_seed(torch.seed())
    model = mlp().to(DEVICE)
    x = torch.randn(8, 16, device=DEVICE, requires_grad=True)
    model(x).pow(2).sum().backward()
    plain = [p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()]
    model.zero_grad()
    x.grad = None
    checkpoint.checkpoint(model, x, use_reentrant=reentrant).pow(2).sum().backward()
    again = [p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()]
    for a, b in zip(again, plain):
        # The same ops recomputed on the same device: the same bits.
        torch.testing.assert_close(a, b, rtol=0, atol=0)
