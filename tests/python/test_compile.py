"""torch.compile(backend="tpu"): forward, backward and optimizer graphs are
each captured once per input signature and replayed with no per-op work.
Compiled training gives CPU eager's loss curves; graph breaks, inference
modes and new shapes work."""

import re
import subprocess
import sys
import warnings

import pytest
import torch

import rtpu
from conftest import twins
from test_models import assert_close_to_max, small_gpt, image_batches, small_cnn, token_batches, train, train_on_tpu_and_cpu
from test_step import mlp, mlp_batches
from training import train_step

DEVICE = "tpu"


# (model, optimizer, batches, (rtol, atol) of the loss curve). Measured
# over 6 fresh seeds: within 1.4e-6 relative (gpt; 1.2e-7 mlp and cnn), so
# rtol 2e-5 is a 15x margin. The cnn's ReLU can flip a gradient element
# outright (see test_models' CASES): 1e-4 there.
CASES = {
    "mlp": (mlp, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), mlp_batches, (2e-5, 0)),
    "cnn": (small_cnn, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), image_batches, (1e-4, 0)),
    "gpt": (small_gpt, lambda ps: torch.optim.AdamW(ps, lr=3e-3), token_batches, (2e-5, 0)),
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_compiled_train_step_gives_cpu_eager_loss_curve_by_replaying(name):
    make_model, make_optimizer, make_batches, (rtol, atol) = CASES[name]
    _, tpu, cpu = train_on_tpu_and_cpu(name, make_model, make_optimizer, make_batches, steps=8, mode="compile")
    torch.testing.assert_close(torch.tensor(tpu.losses), torch.tensor(cpu.losses), rtol=rtol, atol=atol)
    # Buffers the compiled forward mutates (BatchNorm statistics) match too:
    # measured within 1.5e-6 of each one's largest value, 2.9e-5 after a
    # ReLU flip (see CASES), so 1e-4.
    for (n, b), (_, c) in zip(tpu.model.named_buffers(), cpu.model.named_buffers()):
        if b.is_floating_point():
            assert_close_to_max(b.cpu(), c, 1e-4, n)
        else:
            assert torch.equal(b.cpu(), c), n


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
    # The optimizer's replays overwrite every weight and momentum buffer in
    # the memory of the old one.
    overwritten = 2 * len(list(model.parameters()))
    assert after["buffers_donated"] - before["buffers_donated"] == overwritten * steps


# Measured over 6 seeds: loss curves within 2.0e-7 (SGD) and 2.2e-6 (AdamW)
# relative, weights within 2.1e-7 and 2.4e-4 of each tensor's largest value
# (AdamW moves a weight by about lr whatever its gradient's size, so
# rounding can flip a near-zero one); a weight left at its value of the
# capture is off by ~lr per step.
@pytest.mark.parametrize(
    "make_optimizer, weight_tolerance",
    [
        pytest.param(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), 1e-5, id="sgd-momentum"),
        # Capturable on tpu only: PyTorch's CPU AdamW is not (same math).
        pytest.param(
            lambda ps: torch.optim.AdamW(ps := list(ps), lr=1e-2, capturable=ps[0].device.type == DEVICE),
            1e-2,
            id="adamw-capturable",
        ),
    ],
)
def test_optimizer_graphs_skip_aotautograd_and_update_their_attributes_in_place(make_optimizer, weight_tolerance):
    # Dynamo holds an optimizer's parameters and state as graph attributes;
    # with grad mode off and everything on tpu the backend captures its
    # graph as it stands, the attributes bound as inputs.
    seed = torch.seed() % 2**31
    print(f"seed {seed}")
    batches = mlp_batches(seed)
    steps = 8
    torch._dynamo.utils.counters.clear()
    losses, model = train(DEVICE, mlp, make_optimizer, batches, steps, seed, mode="compile")
    # Only the training graph went through AOTAutograd; the optimizer's
    # (its first step, which creates the state, and the later ones) did not.
    assert torch._dynamo.utils.counters["aot_autograd"]["total"] == 1
    cpu_losses, cpu_model = train("cpu", mlp, make_optimizer, batches, steps, seed)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=2e-5, atol=0)
    for (name, p), c in zip(model.named_parameters(), cpu_model.parameters()):
        assert_close_to_max(p.detach().cpu(), c.detach(), weight_tolerance, name)


COMPILED_SGD_STEP = """
import sys
import torch
model = torch.nn.Linear(8, 8).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

@torch.compile(backend="tpu")
def step(x):
    optimizer.zero_grad()
    loss = model(x).square().sum()
    loss.backward()
    optimizer.step()
    return loss

losses = [step(torch.ones(2, 8, device="tpu")).item() for _ in range(3)]
assert losses[2] < losses[0], losses
print("torch._inductor.cudagraph_trees" in sys.modules)
"""


def test_a_compiled_optimizer_step_does_not_import_inductor():
    # Dynamo's check of each gradient for CUDA graphs imported all of
    # Inductor (1.2-1.4 s of the first step) whatever the device; a fresh
    # process, since another test may have imported it here.
    done = subprocess.run([sys.executable, "-c", COMPILED_SGD_STEP], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_no_grad_graph_that_turns_grad_on_keeps_its_gradients():
    # Such a graph returns tensors autograd must differentiate, so it goes
    # through AOTAutograd like any training graph.
    def f(x, w):
        with torch.enable_grad():
            return (x * w).sin()

    w_cpu = torch.randn(4, requires_grad=True)
    w = w_cpu.detach().to(DEVICE).requires_grad_()
    compiled = torch.compile(f, backend="tpu")
    for _ in range(3):
        x = torch.randn(4)
        with torch.no_grad():
            y, y_cpu = compiled(x.to(DEVICE), w), f(x, w_cpu)
        w.grad = w_cpu.grad = None
        y.sum().backward()
        y_cpu.sum().backward()
        torch.testing.assert_close(w.grad.cpu(), w_cpu.grad, rtol=1e-5, atol=1e-6)


def test_a_no_grad_graph_that_calls_a_module_reads_its_weights_afresh():
    # Without inlining Dynamo calls the module from its graph; its weights
    # are no inputs then, so the graph goes through AOTAutograd, which
    # lifts them: a capture would keep the weights it saw.
    model_cpu, model = twins(lambda: torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    with torch._dynamo.config.patch(inline_inbuilt_nn_modules=False), torch.no_grad():
        compiled = torch.compile(model, backend="tpu")
        for _ in range(3):
            torch.testing.assert_close(compiled(x.to(DEVICE)).cpu(), model_cpu(x), rtol=1e-5, atol=1e-6)
            model.weight.add_(1.0)
            model_cpu.weight.add_(1.0)


@pytest.mark.parametrize(
    "reshape_",
    [
        lambda x: x.unsqueeze_(0),
        lambda x: x.squeeze_(),
        lambda x: x.transpose_(0, 2),
        lambda x: x.resize_(2, 2),
        lambda x: x.as_strided_((2, 2), (1, 2)),
    ],
    ids=["unsqueeze_", "squeeze_", "transpose_", "resize_", "as_strided_"],
)
def test_a_no_grad_graph_that_reshapes_its_input_in_place_does_so_on_every_call(reshape_):
    # A replay writes values only: this holds because Dynamo applies an
    # input's in-place shape changes outside the graph it hands over.
    def f(x):
        reshape_(x)
        return x * 2 + 1

    compiled = torch.compile(f, backend="tpu")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 2, 2)
            t = x.to(DEVICE)
            out, expected = compiled(t), f(x)
            assert t.shape == x.shape and t.stride() == x.stride()
            torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_compiled_replays_launch_back_to_back_without_waiting_for_the_device():
    """The forward checks its targets' range on the device; the backward and
    optimizer programs take that check's flag as an input instead of waiting
    for it, so a compiled step holds the host for its launches only."""
    seed = torch.seed()
    print("seed", seed)
    model_cpu, model = twins(mlp)
    optimizer_cpu = torch.optim.SGD(model_cpu.parameters(), lr=0.05, momentum=0.9)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = torch.compile(train_step, backend="tpu")
    batches = mlp_batches(seed % 2**31)
    expected = [train_step(model_cpu, optimizer_cpu, x, y).item() for x, y in batches]
    on_device = [(x.to(DEVICE), y.to(DEVICE)) for x, y in batches]
    # Two steps capture (and wait): the first has no momentum buffers yet.
    losses = [step(model, optimizer, x, y) for x, y in on_device[:2]]
    torch.tpu.synchronize()
    waited = rtpu.metrics()["wait_ns"]
    losses += [step(model, optimizer, x, y) for x, y in on_device[2:]]
    assert rtpu.metrics()["wait_ns"] == waited
    # Measured within 1.2e-7 relative (see CASES).
    torch.testing.assert_close(torch.tensor([l.item() for l in losses]), torch.tensor(expected), rtol=2e-5, atol=0)


def test_a_compiled_adamw_with_cpu_step_counts_replays_and_keeps_its_state():
    # AdamW's default (non-capturable) state keeps each step count on the
    # CPU: its increments and bias corrections run on the host each call and
    # enter the optimizer graph as inputs, so that graph still replays.
    seed = torch.seed() % 2**31
    print(f"seed {seed}")
    batches = [(x.to(DEVICE), y.to(DEVICE)) for x, y in mlp_batches(seed)]
    steps, warm_up = 12, 3
    torch.manual_seed(seed)
    model = mlp().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = torch.compile(train_step, backend="tpu")
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(steps):
            if i == warm_up:
                before = rtpu.metrics()
            losses.append(step(model, optimizer, *batches[i % len(batches)]).detach())
    after = rtpu.metrics()
    assert not [str(w.message) for w in caught if "rtpu" in str(w.message)]  # no graph runs op by op
    assert after["graph_executions"] - before["graph_executions"] == 3 * (steps - warm_up)
    assert after["ops_recorded"] == before["ops_recorded"]

    cpu_optimizer = []

    def cpu_adamw(params):
        cpu_optimizer.append(torch.optim.AdamW(params, lr=1e-2))
        return cpu_optimizer[0]

    cpu_losses, _ = train("cpu", mlp, cpu_adamw, [(x.cpu(), y.cpu()) for x, y in batches], steps, seed)
    torch.testing.assert_close(torch.tensor([loss.item() for loss in losses]), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-6)
    # The moments are sums of gradients; compared as whole tensors: the
    # parameters divide by tiny second moments, which amplifies rounding, and
    # when that moves a ReLU input across 0 whole rows of gradients change
    # (seed 711525908: 3.5% of a moment's norm, against ~1e-5 usually). A
    # state reset after step k of the 12 loses about k/12 of exp_avg_sq
    # (beta2 = 0.999): 16% or more from the second step on.
    for state in optimizer.state.values():
        assert state["step"].device.type == "cpu" and state["step"].item() == steps
        assert state["exp_avg"].device.type == DEVICE
    for state, cpu_state in zip(optimizer.state.values(), cpu_optimizer[0].state.values()):
        for name in ("exp_avg", "exp_avg_sq"):
            got, want = state[name].cpu(), cpu_state[name]
            assert (got - want).norm() <= 0.1 * want.norm(), name


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


def compiled_eval_gpt():
    """A GPT in eval mode on CPU, and the same weights on tpu, compiled."""
    torch.manual_seed(0)
    cpu_model = small_gpt().eval()
    model = small_gpt().eval().to(DEVICE)
    model.load_state_dict(cpu_model.state_dict())
    return cpu_model, torch.compile(model, backend="tpu")


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_under_no_grad_and_inference_mode(mode):
    cpu_model, compiled = compiled_eval_gpt()
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


def test_integer_indexing_replays_as_one_program_with_fresh_indices(recwarn):
    # x[i], x[i, j] and x[i, j] += v keep their indices on the device, so
    # the graph replays for new index values instead of running op by op.
    def gather_and_scatter(x, i, j):
        y = x.clone()
        y[i, j] += 1.0
        return x[i] * 2, y

    compiled = torch.compile(gather_and_scatter, backend="tpu")
    x = torch.randn(6, 5)
    for step in range(4):
        i, j = torch.randint(-6, 6, (3,)), torch.randint(0, 5, (3,))
        before = rtpu.metrics()
        got = compiled(x.to(DEVICE), i.to(DEVICE), j.to(DEVICE))
        after = rtpu.metrics()
        for g, w in zip(got, gather_and_scatter(x, i, j)):
            torch.testing.assert_close(g.cpu(), w)
        if step > 0:
            assert after["graph_executions"] - before["graph_executions"] == 1
            assert after["ops_recorded"] == before["ops_recorded"]
    assert not [str(w.message) for w in recwarn if "rtpu" in str(w.message)]


# Sizes and the power-of-two buckets they compile for: each bucket is met
# again with a different size, after others.
DYNAMIC_SIZES = (8, 12, 5, 16, 11, 3, 8, 13)


def bucket_of(size):
    return 1 << (size - 1).bit_length()


def test_a_dynamic_sequence_length_compiles_one_graph_per_bucket_and_explains_new_ones(capfd):
    cpu_model, compiled = compiled_eval_gpt()
    rtpu.debug.explain_recompiles()
    try:
        with torch.no_grad():
            seen, recompiled = set(), {}
            for length in DYNAMIC_SIZES:
                tokens = torch.randint(0, 64, (2, length))
                x = tokens.to(DEVICE)
                torch._dynamo.mark_dynamic(x, 1)
                before = rtpu.metrics()["recompiles"]
                out = compiled(x)
                recompiled[length] = rtpu.metrics()["recompiles"] - before
                # The padded positions never reach the valid ones.
                assert out.shape == (2, length, 64)
                torch.testing.assert_close(out.cpu(), cpu_model(tokens), rtol=2e-4, atol=2e-5)
                # One graph compiles per bucket: only a new bucket recompiles.
                assert recompiled[length] == (1 if seen and bucket_of(length) not in seen else 0), recompiled
                seen.add(bucket_of(length))
    finally:
        rtpu.debug.explain_recompiles(False)
    # Dynamo traced one graph for all lengths; the new bucket is explained
    # (the tokens are padded to 2 x 16 instead of 2 x 8).
    explanation = capfd.readouterr().err
    assert re.search(r"recompiling the graph flushed at torch.compile .* changed from int64\[2, 8\] to int64\[2, 16\]", explanation), explanation


class MeanPooled(torch.nn.Module):
    """A sequence classifier: its mean over the sequence divides by the
    dynamic length, forward and backward."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)).mean(1))


# (rtol, atol) of the loss curves of bucketed graphs: padded reductions sum
# in another order than unpadded ones, so these get more room than CASES.
PADDED = (2e-4, 1e-5)

DYNAMIC_CASES = {
    # (model, optimizer, batch of a size, dynamic dim of x, of y, loss tolerances)
    "gpt sequence length": (
        small_gpt,
        lambda ps: torch.optim.AdamW(ps, lr=3e-3),
        lambda g, n: (lambda t: (t[:, :-1], t[:, 1:]))(torch.randint(0, 64, (4, n + 1), generator=g)),
        1,
        1,
        PADDED,
    ),
    "mean-pooled sequence length": (
        MeanPooled,
        lambda ps: torch.optim.SGD(ps, lr=0.1),
        lambda g, n: (torch.randint(0, 64, (4, n), generator=g), torch.randint(0, 5, (4,), generator=g)),
        1,
        None,
        PADDED,
    ),
    "cnn batch": (
        lambda: torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10),
        ),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        lambda g, n: (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)),
        0,
        0,
        PADDED,
    ),
    "cnn with batch norm batch": (
        small_cnn,
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        lambda g, n: (torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)),
        0,
        0,
        PADDED,
    ),
    "mlp batch": (
        mlp,
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        lambda g, n: (torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)),
        0,
        0,
        PADDED,
    ),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_CASES))
def test_training_with_a_dynamic_dim_gives_cpu_losses_and_compiles_once_per_bucket(name):
    make_model, make_optimizer, make_batch, x_dim, y_dim, (rtol, atol) = DYNAMIC_CASES[name]
    seed = torch.seed() % 2**31
    print(f"{name}: seed {seed}")
    g = torch.Generator().manual_seed(seed)
    batches = [make_batch(g, n) for n in DYNAMIC_SIZES]
    expected, cpu_model = train("cpu", make_model, make_optimizer, batches, len(batches), seed)

    torch.manual_seed(seed)
    model = make_model().to(DEVICE)
    optimizer = make_optimizer(model.parameters())
    step = torch.compile(train_step, backend="tpu")
    losses, seen = [], set()
    for n, (x, y) in zip(DYNAMIC_SIZES, batches):
        x, y = x.to(DEVICE), y.to(DEVICE)
        torch._dynamo.mark_dynamic(x, x_dim)
        if y_dim is not None:
            torch._dynamo.mark_dynamic(y, y_dim)
        before = rtpu.metrics()["recompiles"]
        losses.append(step(model, optimizer, x, y).item())
        recompiles = rtpu.metrics()["recompiles"] - before
        # A new bucket compiles the forward and the backward graph again;
        # any size of a bucket met before compiles nothing.
        assert recompiles == (2 if seen and bucket_of(n) not in seen else 0), (n, recompiles)
        seen.add(bucket_of(n))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=rtol, atol=atol)
    # Statistics over the batch (BatchNorm's running mean and variance)
    # count only the true samples.
    for (buffer, b), (_, c) in zip(model.named_buffers(), cpu_model.named_buffers()):
        torch.testing.assert_close(b.cpu(), c, rtol=1e-3, atol=1e-5, msg=buffer)


def test_statistics_over_a_dynamic_dim_count_only_the_true_positions():
    # var and std divide by the true count; their gradients scale by
    # 2 / (n - 1), a float computed from the true size on the device.
    def statistics(x):
        return (x.var(1) * 3).sum() + x.std(1, keepdim=True).sum() + x.var(1, correction=0).sum() + x.mean(1).square().sum()

    compiled = torch.compile(statistics, backend="tpu")
    seen = set()
    for n in DYNAMIC_SIZES:
        x = torch.randn(3, n)
        xt = x.to(DEVICE).requires_grad_()
        torch._dynamo.mark_dynamic(xt, 1)
        before = rtpu.metrics()["recompiles"]
        out = compiled(xt)
        out.backward()
        assert rtpu.metrics()["recompiles"] - before == (2 if seen and bucket_of(n) not in seen else 0), n
        seen.add(bucket_of(n))
        xc = x.clone().requires_grad_()
        expected = statistics(xc)
        expected.backward()
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)


class SlicedPositions(torch.nn.Module):
    """Slices a table of 24 positions to the length, as nanoGPT slices its
    causal mask: a length of 20 pads to 24, not 32, and shares 24's bucket."""

    def __init__(self):
        super().__init__()
        self.register_buffer("positions", torch.randn(24, 8))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(x + self.positions[: x.shape[1]]).softmax(1)


def test_a_bucket_never_outgrows_a_buffer_the_length_slices():
    torch.manual_seed(0)
    cpu_model = SlicedPositions()
    model = SlicedPositions().to(DEVICE)
    model.load_state_dict(cpu_model.state_dict())
    compiled = torch.compile(model, backend="tpu")
    recompiles = []
    for length in (20, 13, 24, 22, 9):
        x = torch.randn(2, length, 8)
        xt = x.to(DEVICE)
        torch._dynamo.mark_dynamic(xt, 1)
        before = rtpu.metrics()["recompiles"]
        torch.testing.assert_close(compiled(xt).cpu(), cpu_model(x), rtol=1e-5, atol=1e-6)
        recompiles.append(rtpu.metrics()["recompiles"] - before)
    # Buckets: 24 (capped from 32), 16, 24, 24, 16.
    assert recompiles == [0, 1, 0, 0, 0], recompiles


TABLE = torch.randn(40, 3)


def last_position(x):
    return x[:, -1] * 2  # reads a position that padding moves


def row_at_length(x):
    return x.sum(1, keepdim=True) * TABLE.to(x.device)[x.shape[1] - 1]  # the size as an index


@pytest.mark.parametrize(
    "fn, refusal",
    [(last_position, r"aten\.select\.int selects from a padded dim"), (row_at_length, r"aten\.select\.int selects at an index computed from a dynamic size")],
)
def test_a_graph_that_cannot_be_padded_compiles_per_size_and_says_which_op(recwarn, fn, refusal):
    compiled = torch.compile(fn, backend="tpu")
    for length in (8, 12, 5):
        x = torch.randn(3, length)
        xt = x.to(DEVICE)
        torch._dynamo.mark_dynamic(xt, 1)
        torch.testing.assert_close(compiled(xt).cpu(), fn(x), rtol=1e-5, atol=1e-5)
    messages = [str(w.message) for w in recwarn if "not bucketed" in str(w.message)]
    assert len(messages) == 1, [str(w.message) for w in recwarn]
    assert re.search(refusal + r" \(File .*test_compile\.py\", line \d+", messages[0]), messages[0]


def test_compiled_graphs_called_inside_a_step_join_its_one_program():
    torch.manual_seed(0)
    model = mlp().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = torch.compile(train_step, backend="tpu")
    batches = mlp_batches(3)
    cpu_losses, _ = train("cpu", mlp, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), batches, 6, 0)
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


def test_a_graph_with_a_cpu_fallback_runs_op_by_op_and_says_so():
    from test_fallback import CANDIDATES, runs_natively

    # The last candidate: test_fallback needs the first one's once-per-process
    # warning still unsaid.
    fallbacks = [(op, fn) for op, fn in CANDIDATES if not runs_natively(op)]
    assert len(fallbacks) >= 2, "add ops the core does not implement to test_fallback.CANDIDATES"
    _, fallback = fallbacks[-1]
    compiled = torch.compile(lambda t: fallback(t * 2, 0) + 1, backend="tpu")
    x = torch.randn(3, 5)
    # The fallback reads the op's inputs on the host, which is what stops the
    # capture first.
    reason = "an op read tensor values on the host"
    with pytest.warns(UserWarning, match=f"the inference graph compiled by torch.compile runs op by op: {reason}"):
        first = compiled(x.to(DEVICE))
    torch.testing.assert_close(first.cpu(), fallback(x * 2, 0) + 1)
    before = rtpu.metrics()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = compiled(x.to(DEVICE))
    after = rtpu.metrics()
    assert not [str(w.message) for w in caught if "rtpu" in str(w.message)]  # warned once
    # Each call runs the graph's ops one by one (no replay).
    assert after["ops_run"] - before["ops_run"] >= 2
    assert after["graph_executions"] == before["graph_executions"]
    torch.testing.assert_close(second.cpu(), first.cpu())
