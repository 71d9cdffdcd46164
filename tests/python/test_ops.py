"""Every op of the MLP set on 'tpu' against PyTorch on CPU: fresh random
inputs, explicit per-dtype tolerances, non-contiguous inputs, broadcasting,
in-place writes, and gradients through autograd."""

import contextlib

import pytest
import torch

import rtpu

DEVICE = "tpu"

# (rtol, atol) per dtype: fp32 allows XLA's transcendental approximations,
# the 16-bit types their rounding of intermediate results.
TOLERANCES = {
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-12, 1e-12),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
    torch.int64: (0, 0),
    torch.int32: (0, 0),
    torch.bool: (0, 0),
}


def assert_same(got, want, tolerances=TOLERANCES):
    """`got` (tpu) equals `want` (cpu) within the dtype's tolerance."""
    assert got.device.type == DEVICE, got.device
    got = got.cpu()
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    rtol, atol = tolerances.get(want.dtype, (1e-5, 1e-6))
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


def rand(*shape, dtype=torch.float32, low=-2.0, high=2.0):
    if dtype.is_floating_point:
        return (torch.rand(*shape, dtype=torch.float64) * (high - low) + low).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(int(low) * 5, int(high) * 5 + 1, shape, dtype=dtype)


def on_both(fn, *cpu_args):
    """Runs `fn` on the CPU arguments and on their tpu copies."""
    tpu_args = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in cpu_args]
    return fn(*tpu_args), fn(*cpu_args)


FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float64]

BINARY = {
    "add": lambda a, b: a + b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=-2),
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
}


# Integer pow and rounding division have their own tests (operands that
# avoid overflow and zero divisors).
BINARY_CASES = [
    (name, dtype)
    for name in sorted(BINARY)
    for dtype in FLOAT_DTYPES + [torch.int64]
    if not (dtype == torch.int64 and name in ("pow", "div_trunc", "div_floor"))
]


@pytest.mark.parametrize("name,dtype", BINARY_CASES)
def test_binary_broadcasting(name, dtype):
    a, b = rand(4, 3, dtype=dtype), rand(3, dtype=dtype)
    if name.startswith("div"):
        b = torch.where(b == 0, torch.ones_like(b), b)
    got, want = on_both(BINARY[name], a, b)
    assert_same(got, want)


@pytest.mark.parametrize("name", ["add", "mul", "div", "sub"])
def test_binary_with_python_scalars_and_promotion(name):
    fn = BINARY[name]
    ints = rand(5, dtype=torch.int64)
    floats = rand(5)
    for args in [(ints, 2), (ints, 2.5), (floats, 3), (2.5, floats), (ints, floats), (floats.to(torch.bfloat16), floats)]:
        got, want = on_both(fn, *args)
        assert_same(got, want)


def test_integer_pow():
    base = torch.randint(-4, 5, (6, 5))
    exponent = torch.randint(0, 4, (5,))
    for fn in (lambda a, e: torch.pow(a, e), lambda a, e: a**2, lambda a, e: a.pow_(3)):
        got, want = on_both(fn, base.clone(), exponent)
        assert_same(got, want)


def test_integer_rounding_division():
    a = torch.tensor([7, -7, 9, -9, 0])
    b = torch.tensor([2, 2, -4, -4, 3])
    for mode in ("trunc", "floor"):
        got, want = on_both(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
        assert_same(got, want)


UNARY = {
    "neg": torch.neg,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.1),
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "abs": torch.abs,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.7),
    "clamp_min": lambda x: torch.clamp(x, min=0.1),
    "square": lambda x: x**2,
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_unary_on_non_contiguous_input(name, dtype):
    x = rand(5, 6, dtype=dtype).t()  # a transposed view
    assert not x.is_contiguous()
    got, want = on_both(UNARY[name], x)
    assert_same(got, want)


@pytest.mark.parametrize("name", ["exp", "sqrt", "tanh", "sigmoid", "relu", "neg", "abs"])
def test_unary_in_place_and_out(name):
    x = rand(8).abs() + 0.1
    inplace = getattr(torch.Tensor, name + "_")
    t = x.to(DEVICE)
    inplace(t)
    assert_same(t, inplace(x.clone()))
    if name == "relu":
        return  # torch.relu has no out= form
    out = torch.empty(0, device=DEVICE)
    getattr(torch, name)(x.to(DEVICE), out=out)
    assert_same(out, getattr(torch, name)(x))


def test_in_place_writes_through_views():
    x = rand(3, 4)
    t = x.to(DEVICE)
    t[:, 1].add_(1)
    x[:, 1].add_(1)
    assert_same(t, x)
    y, yt = x.t(), t.t()
    y.mul_(2)
    yt.mul_(2)
    assert_same(t, x)
    t[1].zero_()
    x[1].zero_()
    assert_same(t, x)
    t[::2, ::3].fill_(5)
    x[::2, ::3].fill_(5)
    assert_same(t, x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_reductions(dtype):
    x = rand(4, 5, 6, dtype=dtype)
    cases = [
        lambda t: t.sum(),
        lambda t: t.sum(dim=1),
        lambda t: t.sum(dim=(0, 2), keepdim=True),
        lambda t: t.mean(),
        lambda t: t.mean(dim=-1, keepdim=True),
        lambda t: t.amax(dim=1),
        lambda t: t.argmax(dim=2),
        lambda t: t.argmax(),
        lambda t: t.sum(dim=0, dtype=torch.float64),
    ]
    for fn in cases:
        got, want = on_both(fn, x)
        assert_same(got, want)


def test_var_and_std_of_float16_round_once():
    # ATen computes them in float32 and rounds the result once; rounding
    # the mean and each square to float16 drifts past the tolerance on some
    # of many short rows (bfloat16's tolerance is wider than that drift).
    x = rand(500, 5, dtype=torch.float16, low=-8.0, high=8.0)
    for fn in [
        lambda t: t.var(dim=1),
        lambda t: t.std(dim=1, correction=0),
        lambda t: torch.var_mean(t, dim=1, keepdim=True),
        lambda t: torch.std_mean(t, dim=1),
    ]:
        got, want = on_both(fn, x)
        for g, w in zip(got, want) if isinstance(want, tuple) else [(got, want)]:
            assert_same(g, w)


def test_integer_sum_promotes_to_int64():
    got, want = on_both(lambda t: t.sum(dim=0), rand(4, 3, dtype=torch.int32))
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_matmuls(dtype):
    a, b, c, bias = rand(6, 5, dtype=dtype), rand(5, 4, dtype=dtype), rand(3, 6, 5, dtype=dtype), rand(4, dtype=dtype)
    got, want = on_both(torch.mm, a, b)
    assert_same(got, want)
    got, want = on_both(lambda x, y, z: torch.addmm(z, x, y, beta=0.5, alpha=2.0), a, b, bias)
    assert_same(got, want)
    got, want = on_both(lambda x, y: torch.bmm(x, y.expand(3, 5, 4)), c, b)
    assert_same(got, want)
    got, want = on_both(lambda x, y: x @ y.t(), a, rand(7, 5, dtype=dtype))
    assert_same(got, want)


def test_a_linear_layer_puts_its_larger_operand_first(tmp_path, monkeypatch):
    # x @ W.T with W the larger: XLA's CPU plugin packs the dot's right
    # operand, slowly when it contracts its minor dim, so rtpu computes
    # (W @ x.T).T, with a barrier that keeps XLA from folding it back.
    monkeypatch.setenv("RTPU_DUMP_DIR", str(tmp_path))
    # (Shapes no other test uses: a program is dumped when it compiles.)
    x, w, bias = rand(3, 7), rand(11, 7), rand(11)
    got, want = on_both(torch.nn.functional.linear, x, w, bias)
    assert_same(got, want)
    (program,) = [p.read_text() for p in tmp_path.glob("*.mlir") if "dot_general" in p.read_text()]
    assert "stablehlo.optimization_barrier" in program and "-> tensor<11x3xf32>" in program, program
    # With x the larger, the dot already packs the smaller operand; with
    # many rows of x, packing W once costs little per row.
    for x, w in [(rand(19, 7), w), (rand(600, 3), rand(700, 3))]:
        for p in tmp_path.glob("*.mlir"):
            p.unlink()
        got, want = on_both(torch.nn.functional.linear, x, w)
        assert_same(got, want)
        (program,) = [p.read_text() for p in tmp_path.glob("*.mlir") if "dot_general" in p.read_text()]
        assert "stablehlo.optimization_barrier" not in program, program


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_and_losses(dtype):
    x = rand(8, 10, dtype=dtype)
    target = torch.randint(0, 10, (8,))
    for fn in [
        lambda t: torch.softmax(t, dim=1),
        lambda t: torch.log_softmax(t, dim=-1),
        lambda t: torch.softmax(t, dim=0),
    ]:
        got, want = on_both(fn, x)
        assert_same(got, want)
    for reduction in ("mean", "sum", "none"):
        got, want = on_both(lambda t, y: torch.nn.functional.cross_entropy(t, y, reduction=reduction), x, target)
        assert_same(got, want)
        got, want = on_both(lambda t, y: torch.nn.functional.mse_loss(t, y, reduction=reduction), x, rand(8, 10, dtype=dtype))
        assert_same(got, want)
    weight = rand(10, dtype=dtype).abs() + 0.1
    ignored = target.clone()
    ignored[::3] = -100
    got, want = on_both(lambda t, y, w: torch.nn.functional.nll_loss(t, y, weight=w), torch.log_softmax(x, 1), ignored, weight)
    assert_same(got, want)


def test_where_clamp_tensor_bounds_and_threshold_backward():
    x, y = rand(4, 5), rand(4, 5)
    got, want = on_both(lambda a, b: torch.where(a > b, a, b), x, y)
    assert_same(got, want)
    got, want = on_both(lambda a, lo, hi: torch.clamp(a, lo, hi), x, y - 1, y + 1)
    assert_same(got, want)
    got, want = on_both(lambda g, a: torch.ops.aten.threshold_backward(g, a, 0.0), y, x)
    assert_same(got, want)


def test_addcmul_addcdiv_lerp_in_place():
    x, a, b = rand(6), rand(6), rand(6).abs() + 0.5
    for fn in [
        lambda s, p, q: s.addcmul_(p, q, value=0.3),
        lambda s, p, q: s.addcdiv_(p, q, value=-0.7),
        lambda s, p, q: s.lerp_(p, 0.25),
    ]:
        t = x.to(DEVICE)
        fn(t, a.to(DEVICE), b.to(DEVICE))
        assert_same(t, fn(x.clone(), a, b))


def test_shape_ops_and_indexing():
    x = rand(4, 6)
    idx = torch.tensor([3, 0, 3, 1])
    for fn in [
        lambda t: torch.cat([t, t * 2], dim=0),
        lambda t: torch.cat([t, t[:, :2]], dim=1),
        lambda t: torch.stack([t, t + 1], dim=1),
        lambda t: t.t().contiguous(),
        lambda t: t.permute(1, 0).reshape(3, 8),
        lambda t: t.unsqueeze(0).expand(3, 4, 6).sum(0),
        lambda t: torch.index_select(t, 0, idx.to(t.device)),
        lambda t: torch.index_select(t, 1, idx.to(t.device)),
        lambda t: torch.gather(t, 1, torch.tensor([[0, 5], [1, 1], [2, 0], [3, 3]], device=t.device)),
    ]:
        got, want = on_both(fn, x)
        assert_same(got, want)


def test_factories_and_casts():
    for fn in [
        lambda d: torch.zeros(3, 4, device=d),
        lambda d: torch.ones(2, 3, dtype=torch.int64, device=d),
        lambda d: torch.full((2, 2), 3.5, device=d),
        lambda d: torch.arange(7, device=d),
        lambda d: torch.arange(1.0, 3.0, 0.25, device=d),
        lambda d: torch.arange(10, 0, -3, device=d),
    ]:
        assert_same(fn(DEVICE), fn("cpu"))
    x = rand(5, 3)
    for dtype in (torch.float64, torch.bfloat16, torch.int32, torch.int64, torch.bool, torch.float16):
        got, want = on_both(lambda t: t.to(dtype), x)
        assert_same(got, want)


def test_random_factories_have_the_right_statistics():
    torch.tpu.manual_seed(0)
    u = torch.rand(10000, device=DEVICE).cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    n = torch.randn(10000, device=DEVICE).cpu()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    torch.tpu.manual_seed(0)
    again = torch.rand(10000, device=DEVICE).cpu()
    assert torch.equal(u, again), "the same seed gives the same numbers"
    assert not torch.equal(torch.rand(100, device=DEVICE).cpu(), torch.rand(100, device=DEVICE).cpu())


def test_gradients_match_cpu():
    x, w, b = rand(8, 5), rand(3, 5), rand(3)
    target = torch.randint(0, 3, (8,))

    def loss_and_grads(device):
        xs = x.to(device).requires_grad_()
        ws = w.to(device).requires_grad_()
        bs = b.to(device).requires_grad_()
        h = torch.nn.functional.linear(torch.tanh(xs), ws, bs).relu()
        loss = torch.nn.functional.cross_entropy(h, target.to(device)) + (h.sigmoid() ** 2).mean()
        loss.backward()
        return [loss, xs.grad, ws.grad, bs.grad]

    for got, want in zip(loss_and_grads(DEVICE), loss_and_grads("cpu")):
        assert_same(got.detach(), want.detach())


def test_optimizer_foreach_steps_match_cpu():
    params = [rand(4, 3), rand(3)]
    grads = [rand(4, 3), rand(3)]
    for make in (
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    ):
        results = {}
        for device in ("cpu", DEVICE):
            ps = [p.detach().clone().to(device).requires_grad_() for p in params]
            opt = make(ps)
            for _ in range(3):
                for p, g in zip(ps, grads):
                    p.grad = g.to(device)
                opt.step()
            results[device] = ps
        for got, want in zip(results[DEVICE], results["cpu"]):
            assert_same(got.detach(), want.detach())


def test_bad_input_raises_and_keeps_values():
    a, b = rand(3).to(DEVICE), rand(4).to(DEVICE)
    before = a.cpu()
    with pytest.raises(RuntimeError, match="broadcast"):
        a.add_(b)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.index_select(a, 0, torch.tensor([0, 9], device=DEVICE))
    with pytest.raises(RuntimeError):
        torch.mm(rand(2, 3).to(DEVICE), rand(2, 3).to(DEVICE))
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.nn.functional.cross_entropy(rand(2, 3).to(DEVICE), torch.tensor([0, 7], device=DEVICE))
    assert torch.equal(a.cpu(), before)
    assert_same(a + 1, before + 1)


def test_metrics_count_ops_and_compiles():
    before = rtpu.metrics()
    x = rand(16, 16).to(DEVICE)
    for _ in range(3):
        x = torch.tanh(x * 0.5)
    after = rtpu.metrics()
    assert after["ops_run"] >= before["ops_run"] + 6
    assert after["cache_hits"] >= before["cache_hits"] + 4


# ----- the hot ops' typed kernels (cpp_shim/typed_kernels.cpp) ---------------
# They read PyTorch's C++ arguments directly and send every call they do not
# take as is to the boxed kernel: both paths must give the same results.

F = torch.nn.functional
TYPED_KERNEL_CALLS = {
    "gelu_tanh": lambda x, y, w: F.gelu(x, approximate="tanh"),
    "gelu_backward": lambda x, y, w: torch.ops.aten.gelu_backward(y, x, approximate="tanh"),
    "sum_all_as_dtype": lambda x, y, w: torch.sum(x, dim=None, dtype=torch.float64),
    "sum_dims_keepdim": lambda x, y, w: x.sum((0, 1), keepdim=True),
    "clone_preserve": lambda x, y, w: x.t().clone(memory_format=torch.preserve_format),
    "addmm_beta_alpha": lambda x, y, w: torch.addmm(y[0], x, w, beta=0.5, alpha=-2),
    "softmax_backward": lambda x, y, w: torch.ops.aten._softmax_backward_data(y, x.softmax(1), 1, x.dtype),
    "layer_norm_three_outputs": lambda x, y, w: torch.native_layer_norm(x, [6], w[0], None, 1e-5),
    "layer_norm_backward_masked": lambda x, y, w: torch.ops.aten.native_layer_norm_backward(
        y, x, [6], *torch.native_layer_norm(x, [6], w[0], w[1], 1e-5)[1:], w[0], w[1], [True, False, True]
    ),
    "nll_loss_ignore_index": lambda x, y, w: F.nll_loss(
        x.log_softmax(1), torch.tensor([1, 0, 1, 2], device=x.device), ignore_index=1
    ),
    "where_scalar_other": lambda x, y, w: torch.where(x > 0, x, 0.5),
    "zero_dim_cpu_other": lambda x, y, w: x * torch.tensor(3.0),
    "foreach_sqrt_list": lambda x, y, w: torch.cat(torch._foreach_sqrt([x.abs(), y.abs()])),
}


@pytest.mark.parametrize("name", sorted(TYPED_KERNEL_CALLS))
@pytest.mark.parametrize("in_step", [False, True], ids=["eager", "step"])
def test_typed_kernels_match_cpu(name, in_step):
    fn = TYPED_KERNEL_CALLS[name]
    x, y, w = rand(4, 6), rand(4, 6), rand(6, 6)
    want = fn(x, y, w)
    with rtpu.step() if in_step else contextlib.nullcontext():
        got = fn(x.to(DEVICE), y.to(DEVICE), w.to(DEVICE))
    for g, e in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        if e is None:
            assert g is None
        else:
            assert_same(g, e, {**TOLERANCES, torch.float32: (1e-5, 1e-5)})


def test_typed_in_place_and_foreach_kernels_write_their_arguments():
    x, y = rand(5), rand(5)
    t = x.to(DEVICE)
    assert t.add_(y.to(DEVICE), alpha=2) is t
    assert t.mul_(torch.tensor(0.5)) is t  # a 0-dim CPU tensor: the boxed path
    assert_same(t, (x + 2 * y) * 0.5)
    params = [rand(3, 2), rand(4)]
    steps = [rand(3, 2), rand(4)]
    on_tpu = [p.to(DEVICE) for p in params]
    torch._foreach_add_(on_tpu, [s.to(DEVICE) for s in steps])
    torch._foreach_mul_(on_tpu, 0.25)
    torch._foreach_addcdiv_(on_tpu, on_tpu, [s.abs().to(DEVICE) + 1 for s in steps], value=0.1)
    torch._foreach_add_(params, steps)
    torch._foreach_mul_(params, 0.25)
    torch._foreach_addcdiv_(params, params, [s.abs() + 1 for s in steps], value=0.1)
    for got, want in zip(on_tpu, params):
        assert_same(got, want)


def test_typed_kernels_send_conjugate_views_to_the_boxed_kernel():
    # Complex numbers with an imaginary part: test_complex.py's CPU_RUN.
    z = torch.randn(4, dtype=torch.complex64)
    u = torch.randn(4, dtype=torch.complex64)
    got = z.to(DEVICE).conj() * u.to(DEVICE)
    torch.testing.assert_close(got.cpu(), z.conj() * u)
    got = u.to(DEVICE).add_(z.to(DEVICE).conj())
    torch.testing.assert_close(got.cpu(), u + z.conj())


def replayed(fn):
    """How many ops `fn()` ran by an earlier call's plan."""
    before = rtpu.metrics()["ops_replayed"]
    fn()
    return rtpu.metrics()["ops_replayed"] - before


def test_repeated_eager_ops_replay_their_plans_with_each_calls_values():
    x, y = rand(6, 4), rand(6, 4)
    t, u = x.to(DEVICE), y.to(DEVICE)
    want_t = x.clone()
    for i in range(4):
        # New values every call, the same shapes: the plans' programs read
        # this call's buffers. A plan is made on the second call.
        a, b = rand(6, 4), rand(6, 4)
        n = replayed(lambda: assert_same(a.to(DEVICE) * 1.5 + b.to(DEVICE), a * 1.5 + b))
        assert n > 0 or i < 2
        # In place, the same storage twice, an out= tensor and a transposed view.
        t.add_(u, alpha=0.5)
        want_t.add_(y, alpha=0.5)
        assert_same(t, want_t)
        assert_same(t.mul_(t), want_t.mul_(want_t))
        out = torch.empty(4, 6, device=DEVICE)
        assert torch.sub(t.t(), u.t(), out=out) is out
        assert_same(out, want_t.t() - y.t())
    # A scalar that changes each call is a value of each call's own.
    for scale in (0.5, 2.0, -3.0, 0.5):
        assert_same(t * scale, want_t * scale)


def test_ops_whose_graph_depends_on_tensor_values_are_never_replayed():
    x = rand(8)
    t = x.to(DEVICE)
    for _ in range(3):
        mask = torch.rand(8) > 0.5
        assert_same(t[mask.to(DEVICE)], x[mask])
    # A range check of the targets reads them on the host in eager mode: a
    # bad target after good ones is still an error.
    logits = rand(4, 5).to(DEVICE)
    good = torch.tensor([0, 1, 2, 3], device=DEVICE)
    for _ in range(2):
        torch.nn.functional.cross_entropy(logits, good)
    with pytest.raises(Exception, match="[Tt]arget|out of bounds|range"):
        torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 7], device=DEVICE)).cpu()
    # A generator's state changes every call.
    torch.manual_seed(0)
    t = torch.ones(1000, device=DEVICE)
    first, second = torch.nn.functional.dropout(t, 0.5), torch.nn.functional.dropout(t, 0.5)
    assert not torch.equal(first.cpu(), second.cpu())


def test_a_plan_made_on_a_written_storage_is_not_used_for_a_never_written_one():
    # A storage never written reads as zeros: a constant of the op's graph,
    # not an input.
    x = rand(5)
    for _ in range(2):
        assert_same(torch.zeros(5, device=DEVICE) + x.to(DEVICE), x)
        assert_same(torch.empty(5, device=DEVICE).zero_() + x.to(DEVICE), x)
