"""torch.compile(backend="tpu"): forward, backward and optimizer graphs are
each captured once per input signature and replayed with no per-op work.
Compiled training gives CPU eager's loss curves; graph breaks, inference
modes and new shapes work."""

import re

import pytest
import torch
import torch.nn.functional as F

import rtpu
from test_models import GPT, image_batches, small_cnn, token_batches
from test_step import mlp, mlp_batches

DEVICE = "tpu"


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss


def train(device, make_model, make_optimizer, batches, steps, seed, compiled):
    torch.manual_seed(seed)
    model = make_model().to(device)
    optimizer = make_optimizer(model.parameters())
    step = torch.compile(train_step, backend="tpu") if compiled else train_step
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        losses.append(step(model, optimizer, x.to(device), y.to(device)).detach())
    return [loss.item() for loss in losses], model


# (model, optimizer, batches, (rtol, atol) of the loss curve): the eager
# model tests' tolerances.
CASES = {
    "mlp": (mlp, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), mlp_batches, (1e-4, 1e-6)),
    "cnn": (small_cnn, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), image_batches, (2e-3, 1e-5)),
    "gpt": (GPT, lambda ps: torch.optim.AdamW(ps, lr=3e-3), token_batches, (2e-3, 1e-5)),
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_compiled_train_step_gives_cpu_eager_loss_curve_by_replaying(name):
    make_model, make_optimizer, make_batches, (rtol, atol) = CASES[name]
    seed = torch.seed() % 2**31
    print(f"{name}: seed {seed}")  # shown on failure, to replay it
    batches = make_batches(seed)
    steps = 8
    before = rtpu.metrics()
    tpu_losses, tpu_model = train(DEVICE, make_model, make_optimizer, batches, steps, seed, compiled=True)
    after = rtpu.metrics()
    cpu_losses, cpu_model = train("cpu", make_model, make_optimizer, batches, steps, seed, compiled=False)
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=rtol, atol=atol)
    # The last pass over the batches has a lower mean loss than the first.
    cycle = len(batches)
    assert sum(tpu_losses[-cycle:]) < sum(tpu_losses[:cycle]), f"the loss goes down: {tpu_losses}"
    assert after["cpu_fallbacks"] == before["cpu_fallbacks"], "an op fell back to the CPU"
    # Buffers the compiled forward mutates (BatchNorm statistics) match too.
    for (n, b), (_, c) in zip(tpu_model.named_buffers(), cpu_model.named_buffers()):
        torch.testing.assert_close(b.cpu(), c, rtol=1e-3, atol=1e-5, msg=n)


def test_a_100_step_compiled_loop_compiles_each_graph_once_and_replays_without_per_op_work():
    torch.manual_seed(0)
    model = mlp().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = torch.compile(train_step, backend="tpu")
    batches = [(x.to(DEVICE), y.to(DEVICE)) for x, y in mlp_batches(2)]
    warm_up = 3
    for i in range(100):
        if i == warm_up:
            before = rtpu.metrics()
        loss = step(model, optimizer, *batches[i % len(batches)])
    after = rtpu.metrics()
    assert torch.isfinite(loss).item()
    steps = 100 - warm_up
    assert after["executables_compiled"] == before["executables_compiled"]
    # Nothing is recorded op by op: forward, backward and optimizer graphs
    # are replayed, three executions a step.
    assert after["ops_recorded"] == before["ops_recorded"]
    assert after["graph_executions"] - before["graph_executions"] == 3 * steps
    # Eager work per step is at most the seed gradient of backward().
    assert after["ops_run"] - before["ops_run"] <= steps


def test_graph_breaks_run_the_pieces_and_explain_counts_them():
    def f(x):
        y = torch.sin(x) * 2
        torch._dynamo.graph_break()
        return (y @ y.T).relu().sum(0)

    x = torch.randn(6, 6)
    compiled = torch.compile(f, backend="tpu")
    torch.testing.assert_close(compiled(x.to(DEVICE)).cpu(), f(x), rtol=1e-5, atol=1e-5)
    explanation = torch._dynamo.explain(f)(x.to(DEVICE))
    assert explanation.graph_count == 2
    assert explanation.graph_break_count == 1


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_under_no_grad_and_inference_mode(mode):
    torch.manual_seed(0)
    cpu_model = GPT().eval()
    model = GPT().eval().to(DEVICE)
    model.load_state_dict(cpu_model.state_dict())
    compiled = torch.compile(model, backend="tpu")
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    tokens = torch.randint(0, 64, (2, 16))
    with context():
        for _ in range(3):
            out = compiled(tokens.to(DEVICE))
        before = rtpu.metrics()
        out = compiled(tokens.to(DEVICE))
        after = rtpu.metrics()
        expected = cpu_model(tokens)
    torch.testing.assert_close(out.cpu(), expected, rtol=2e-4, atol=2e-5)
    assert after["graph_executions"] - before["graph_executions"] == 1
    assert after["ops_recorded"] == before["ops_recorded"]


def test_a_dynamic_sequence_length_compiles_one_graph_per_length_and_explains_new_ones(capfd):
    torch.manual_seed(0)
    cpu_model = GPT().eval()
    model = GPT().eval().to(DEVICE)
    model.load_state_dict(cpu_model.state_dict())
    compiled = torch.compile(model, backend="tpu")
    rtpu.debug.explain_recompiles()
    try:
        with torch.no_grad():
            compiled_per_length = {}
            for length in (8, 12, 8, 12, 16, 8):
                tokens = torch.randint(0, 64, (2, length))
                x = tokens.to(DEVICE)
                torch._dynamo.mark_dynamic(x, 1)
                before = rtpu.metrics()["executables_compiled"]
                out = compiled(x)
                compiled_per_length[length] = compiled_per_length.get(length, 0) + (
                    rtpu.metrics()["executables_compiled"] - before
                )
                torch.testing.assert_close(out.cpu(), cpu_model(tokens), rtol=2e-4, atol=2e-5)
    finally:
        rtpu.debug.explain_recompiles(False)
    assert all(count <= 1 for count in compiled_per_length.values()), compiled_per_length
    # Dynamo traced one graph for all lengths; rtpu compiled one per length,
    # explaining each new one (the embedding reads the 2 x length tokens).
    explanation = capfd.readouterr().err
    assert re.search(r"recompiling the graph flushed at torch.compile .* changed from int64\[16\] to int64\[24\]", explanation), explanation


def test_compiled_graphs_called_inside_a_step_join_its_one_program():
    torch.manual_seed(0)
    model = mlp().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = torch.compile(train_step, backend="tpu")
    batches = mlp_batches(3)
    cpu_losses, _ = train("cpu", mlp, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), batches, 6, 0, False)
    losses = []
    for i in range(6):
        x, y = batches[i % len(batches)]
        if i == 3:
            before = rtpu.metrics()
        with rtpu.step():
            losses.append(step(model, optimizer, x.to(DEVICE), y.to(DEVICE)).detach())
    after = rtpu.metrics()
    torch.testing.assert_close(torch.tensor([loss.item() for loss in losses]), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-6)
    # Forward, backward and optimizer graphs were recorded into the step,
    # which ran as one program, compiled once.
    assert after["graph_executions"] - before["graph_executions"] == 3
    assert after["executables_compiled"] == before["executables_compiled"]
