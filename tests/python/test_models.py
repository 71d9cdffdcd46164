"""Real models train on 'tpu' with CPU's loss curve (fp32, rel 2e-3) and
no CPU fallback: torchvision's resnet18 on 32x32 inputs, a 2-layer GPT
(embedding, SDPA, LayerNorm, GELU, AdamW), and a small CNN with BatchNorm
and Dropout(0) in train and eval mode.

ResNet-18 is the exception to rel 2e-3 after its first step: at 32x32 its
last stage is 1x1, so BatchNorm normalises 16 values per channel, and a
ReLU input within rounding of 0 that lands on the other side flips one
gradient element; momentum then amplifies the difference. CPU float32
itself drifts from CPU float64 by up to ~6e-4 on this setup, and rtpu
(float32 sums in another order) by up to ~1e-2 in absolute loss, so after
its first step its curve is held to 2e-2 absolute (a wrong op moves the
loss by tenths)."""

import pytest
import torch
import torch.nn.functional as F

import rtpu

DEVICE = "tpu"
STEPS = 10


class GPT(torch.nn.Module):
    """A small decoder-only transformer: pre-norm blocks of causal SDPA and a
    GELU MLP, tied to nothing fancy."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, context=16):
        super().__init__()
        self.heads = heads
        self.tokens = torch.nn.Embedding(vocab, d)
        self.positions = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                dict(
                    ln1=torch.nn.LayerNorm(d),
                    qkv=torch.nn.Linear(d, 3 * d),
                    proj=torch.nn.Linear(d, d),
                    ln2=torch.nn.LayerNorm(d),
                    up=torch.nn.Linear(d, 4 * d),
                    down=torch.nn.Linear(4 * d, d),
                )
            )
            for _ in range(layers)
        )
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["down"](F.gelu(blk["up"](blk["ln2"](x))))
        return self.head(self.ln(x))


def assert_loss_goes_down(losses, cycle):
    """The last pass over `cycle` batches has a lower mean loss than the
    first (single losses of different batches need not be ordered)."""
    assert sum(losses[-cycle:]) < sum(losses[:cycle]), f"the loss goes down: {losses}"


def small_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(0.0), torch.nn.Linear(16, 10),
    )


def resnet18():
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(num_classes=10)


def image_batches(seed, batch=4):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(2)]


def token_batches(seed):
    g = torch.Generator().manual_seed(seed)
    return [(t[:, :-1], t[:, 1:]) for t in (torch.randint(0, 64, (4, 17), generator=g) for _ in range(2))]


def train(device, make_model, make_optimizer, batches, seed):
    torch.manual_seed(seed)
    model = make_model().to(device)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = (t.to(device) for t in batches[step % len(batches)])
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


# (model, optimizer, batches, (rtol, atol) of the loss curve after step 0)
CASES = {
    "resnet18": (
        resnet18,
        lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
        lambda seed: image_batches(seed, batch=16),
        (2e-3, 2e-2),
    ),
    "gpt": (GPT, lambda ps: torch.optim.AdamW(ps, lr=3e-3), token_batches, (2e-3, 1e-5)),
    "cnn": (small_cnn, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), image_batches, (2e-3, 1e-5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_curve_matches_cpu_without_fallback(name):
    make_model, make_optimizer, make_batches, (curve_rtol, curve_atol) = CASES[name]
    seed = torch.seed() % 2**31
    print(f"{name}: seed {seed}")  # shown on failure, to replay it
    batches = make_batches(seed)
    fallbacks_before = dict(rtpu.metrics()["cpu_fallbacks"])
    tpu_losses, tpu_model = train(DEVICE, make_model, make_optimizer, batches, seed)
    assert rtpu.metrics()["cpu_fallbacks"] == fallbacks_before, "an op fell back to the CPU"
    cpu_losses, cpu_model = train("cpu", make_model, make_optimizer, batches, seed)
    torch.testing.assert_close(tpu_losses[0], cpu_losses[0], rtol=2e-3, atol=1e-5)
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=curve_rtol, atol=curve_atol)
    assert_loss_goes_down(tpu_losses, len(batches))
    # Eval mode (running BatchNorm statistics) agrees too, as closely as the
    # trained weights do.
    tpu_model.eval()
    cpu_model.eval()
    x = batches[0][0]
    torch.testing.assert_close(
        tpu_model(x.to(DEVICE)).detach().cpu(), cpu_model(x).detach(), rtol=2e-3, atol=max(2e-4, 5 * curve_atol)
    )
