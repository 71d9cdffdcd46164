"""NaN and Inf on 'tpu' against PyTorch on CPU (issue #16, "NaN is dropped").

XLA's CPU max/min (elementwise and in reductions) return an operand where
torch returns NaN, and its sort's total order puts -0.0 and negative NaNs
first; the lowerings select torch's answers explicitly. Every test draws
fresh inputs with NaN (of both signs), +-inf and +-0 sprinkled in and
prints its seed; values compare with NaN equal to NaN, indices exactly
where torch defines which one wins (argmax's first NaN), and by what they
point at where it does not (kthvalue or topk among equal values)."""

import warnings

import pytest
import torch
from conftest import TOLERANCES
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

import rtpu
from opinfo_sweep import op_key

DEVICE = "tpu"
nan, inf = float("nan"), float("inf")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def fresh_generator(name):
    seed = torch.seed() % 2**31
    print(f"{name}: seed {seed}")  # shown on failure, to replay it
    return torch.Generator().manual_seed(seed)


def sprinkle(x, gen, nan_p=0.15, inf_p=0.1):
    """`x` with NaN (either sign), +-inf and +-0.0 at random positions, and
    at least one NaN when it has two elements or more."""
    r = torch.rand(x.shape, generator=gen)
    if x.numel() > 1:
        r.view(-1)[torch.randint(x.numel(), (), generator=gen)] = 0.0
    # copysign, not sign * nan: a product keeps the NaN operand's sign.
    sign = torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    x = x.to(torch.float64)
    x = torch.where(r < nan_p, torch.copysign(torch.full_like(x, nan), sign), x)
    x = torch.where((r >= nan_p) & (r < nan_p + inf_p), sign * inf, x)
    x = torch.where((r >= nan_p + inf_p) & (r < nan_p + inf_p + 0.05), sign * 0.0, x)
    return x


def special(*shape, dtype, gen):
    """Normal values, a third rounded to integers (ties), with NaN, inf and
    signed zeros sprinkled in."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    x = torch.where(torch.rand(shape, generator=gen) < 0.3, x.round(), x)
    return sprinkle(x, gen).to(dtype)


def distinct(*shape, dtype, gen):
    """Distinct finite values (exact in every float dtype) with NaN and inf
    sprinkled in: order statistics whose index is defined have no ties but
    the NaNs and infinities."""
    n = torch.Size(shape).numel()
    x = (torch.randperm(n, generator=gen).to(torch.float64) - n / 2 + 0.5).reshape(shape)
    return sprinkle(x, gen, inf_p=0.05).to(dtype)


def assert_same(got, want):
    """`got` (tpu) equals `want` (cpu): floats within the dtype's tolerance
    with NaN where CPU has NaN, everything else exactly."""
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    if not isinstance(want, torch.Tensor):
        assert got == want
        return
    assert got.device.type == DEVICE, got.device
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.is_floating_point():
        torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCES[want.dtype])
    else:
        assert torch.equal(got, want), f"\n{got}\n!=\n{want}"


def on_both(fn, *args):
    tpu_args = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    return fn(*tpu_args), fn(*args)


def check(fn, *args):
    got, want = on_both(fn, *args)
    assert_same(got, want)


def assert_same_up_to_ties(got, want, x, dim):
    """(values, indices) or argsort's indices `got` (tpu) against `want`
    (cpu): the values as on CPU, and the indices pointing at those values
    in `x`; equal values (NaNs among them) may come in any order."""
    if isinstance(want, tuple):
        assert_same(got[0], want[0])
        got_index, want_values = got[1].cpu(), want[0]
    else:
        got_index, want_values = got.cpu(), torch.gather(x, dim, want) if x.dim() else x
    if x.dim() == 0:
        assert got_index.item() == 0
        return
    if got_index.dim() < x.dim():
        got_index, want_values = got_index.unsqueeze(dim), want_values.unsqueeze(dim)
    picked = torch.gather(x, dim, got_index)
    torch.testing.assert_close(picked, want_values, equal_nan=True, rtol=0, atol=0)


def check_up_to_ties(fn, x, dim):
    got, want = on_both(fn, x)
    assert_same_up_to_ties(got, want, x, dim)


# ----- the issue's reproducer -----


def test_issue_reproducer_keeps_nan():
    x = torch.tensor([1, nan, inf, -inf, 0])
    t = x.to(DEVICE)
    for name in ("max", "min", "amax", "amin"):
        got = getattr(torch, name)(t).cpu()
        assert got.isnan(), f"{name} gave {got}"
        check(getattr(torch, name), x)
    for name in ("argmax", "argmin"):
        assert getattr(torch, name)(t).item() == 1, name
        check(getattr(torch, name), x)
    assert torch.equal(torch.sign(t).cpu(), torch.tensor([1.0, 0.0, 1.0, -1.0, 0.0]))
    check(torch.sign, x)


# ----- reductions -----

EXTREMES = {
    "max": lambda t, d, k: torch.max(t) if d is None else torch.max(t, d, keepdim=k),
    "min": lambda t, d, k: torch.min(t) if d is None else torch.min(t, d, keepdim=k),
    "amax": lambda t, d, k: torch.amax(t, () if d is None else d, keepdim=k),
    "amin": lambda t, d, k: torch.amin(t, () if d is None else d, keepdim=k),
    "argmax": lambda t, d, k: torch.argmax(t, d, keepdim=k),
    "argmin": lambda t, d, k: torch.argmin(t, d, keepdim=k),
    "aminmax": lambda t, d, k: torch.aminmax(t, dim=d, keepdim=k),
    "linalg.vector_norm(inf)": lambda t, d, k: torch.linalg.vector_norm(t, inf, d, keepdim=k),
    "linalg.vector_norm(-inf)": lambda t, d, k: torch.linalg.vector_norm(t, -inf, d, keepdim=k),
    "norm(inf)": lambda t, d, k: torch.norm(t, inf, d, keepdim=k),
    "logsumexp": lambda t, d, k: torch.logsumexp(t, (0, 1) if d is None else d, keepdim=k),
}

PROPAGATING = {
    "sum": lambda t, d, k: torch.sum(t) if d is None else torch.sum(t, d, keepdim=k),
    "prod": lambda t, d, k: torch.prod(t) if d is None else torch.prod(t, d, keepdim=k),
    "mean": lambda t, d, k: torch.mean(t) if d is None else torch.mean(t, d, keepdim=k),
    "std": lambda t, d, k: torch.std(t, d, keepdim=k),
    "var": lambda t, d, k: torch.var(t, d, keepdim=k),
    "norm": lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k),
    "nansum": lambda t, d, k: torch.nansum(t, d, keepdim=k),
    "nanmean": lambda t, d, k: torch.nanmean(t, d, keepdim=k),
    "cumsum": lambda t, d, k: torch.cumsum(t, 0 if d is None else d),
    "softmax": lambda t, d, k: torch.softmax(t, -1 if d is None else d),
}


# The extremes in every float dtype; the reductions that propagate NaN by
# arithmetic in float32 (the OpInfo test below adds bfloat16).
REDUCTION_CASES = [(name, dtype) for name in sorted(EXTREMES) for dtype in DTYPES] + [
    (name, torch.float32) for name in sorted(PROPAGATING)
]


@pytest.mark.parametrize("name,dtype", REDUCTION_CASES)
def test_reduction_over_every_dim_matches_cpu(name, dtype):
    gen = fresh_generator(f"{name} {dtype}")
    fn = EXTREMES.get(name) or PROPAGATING[name]
    x = special(5, 7, dtype=dtype, gen=gen)
    for dim, keepdim in ((None, False), (None, True), (0, True), (1, False), (-1, True)):
        check(lambda t: fn(t, dim, keepdim), x)
    # A row of ties and one of NaN only.
    check(lambda t: fn(t, 1, False), torch.tensor([[2.0] * 7, [nan] * 7], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_extremes_pick_the_first_nan_and_the_first_tie(dtype):
    gen = fresh_generator(f"first nan {dtype}")
    x = special(5, 9, dtype=dtype, gen=gen)
    x[0] = torch.tensor([1, 3, nan, 3, -nan, 1, 0, nan, 3], dtype=dtype)  # first NaN at 2
    x[1] = torch.tensor([2, -1, 2, -1, 0, 2, -1, 0, 0], dtype=dtype)  # ties, no NaN
    want_first = torch.tensor([2, 0], dtype=torch.int64)
    t = x.to(DEVICE)
    assert torch.equal(torch.argmax(t, 1).cpu()[:2], want_first)
    assert torch.equal(torch.max(t, 1).indices.cpu()[:2], want_first)
    assert torch.equal(torch.argmin(t, 1).cpu()[:2], torch.tensor([2, 1]))
    for fn in (torch.argmax, torch.argmin, lambda a: torch.max(a, 1), lambda a: torch.min(a, 0)):
        check(fn, x)


def test_reductions_keep_nan_in_step_mode():
    gen = fresh_generator("step mode")
    x = special(6, 8, dtype=torch.float32, gen=gen)
    fns = [lambda t: t.amax(1), lambda t: t.argmax(0), lambda t: t.max(1), lambda t: t.clamp(-1, 1).sum(1), lambda t: torch.maximum(t, t.flip(0))]
    want = [fn(x) for fn in fns]
    t = x.to(DEVICE)
    with rtpu.step():
        got = [fn(t) for fn in fns]
    for g, w in zip(got, want):
        assert_same(g, w)


# ----- order: sort, order statistics, binary search -----


@pytest.mark.parametrize("dtype", DTYPES)
def test_sort_orders_nan_largest_and_signed_zeros_equal(dtype):
    gen = fresh_generator(f"sort {dtype}")
    x = special(4, 12, dtype=dtype, gen=gen)
    # 0/0 is a NaN with its sign bit set on x86, and -0.0 ties with 0.0.
    x[0, :6] = torch.tensor([1.0, -0.0, 0.0, 0.0, -0.0, 1.0]) / torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    for descending in (False, True):
        for dim in (0, 1):
            check(lambda t: torch.sort(t, dim=dim, descending=descending, stable=True), x)
            check(lambda t: torch.argsort(t, dim=dim, descending=descending, stable=True), x)
    check(torch.msort, x)
    check(torch.median, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_order_statistics_treat_nan_as_largest(dtype):
    gen = fresh_generator(f"order statistics {dtype}")
    x = distinct(5, 10, dtype=dtype, gen=gen)
    x[0, 3] = nan  # every row but the last holds a NaN
    x[1, 0] = -nan
    x[2, 9] = nan
    x[3, 5] = nan
    x[4] = torch.arange(10, dtype=dtype) - 4.5
    for dim in (0, 1):
        check_up_to_ties(lambda t: torch.median(t, dim), x, dim)
        check_up_to_ties(lambda t: torch.nanmedian(t, dim), x, dim)
        check_up_to_ties(lambda t: torch.kthvalue(t, 1, dim), x, dim)
        check_up_to_ties(lambda t: torch.kthvalue(t, 5, dim, keepdim=True), x, dim)
        check_up_to_ties(lambda t: torch.topk(t, 3, dim), x, dim)
        check_up_to_ties(lambda t: torch.topk(t, 3, dim, largest=False), x, dim)
    check(torch.median, x)
    check(torch.nanmedian, x)
    # median gives NaN at its row's first NaN, a defined index.
    rows = torch.tensor([[3, nan, 1, -nan, 2], [3, 1, 2, 0, 4]], dtype=dtype)
    median = torch.median(rows.to(DEVICE), 1)
    assert torch.equal(median.indices.cpu(), torch.tensor([1, 2]))
    assert median.values[0].isnan()
    check(lambda t: torch.median(t, 1), rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binary_search_puts_nan_after_every_boundary(dtype):
    gen = fresh_generator(f"bucketize {dtype}")
    values = special(6, 5, dtype=dtype, gen=gen)
    boundaries = torch.tensor([-2.0, -0.0, 0.5, 3.0], dtype=dtype)
    for right in (False, True):
        check(lambda v, s: torch.bucketize(v, s, right=right), values, boundaries)
        check(lambda s, v: torch.searchsorted(s, v, right=right), boundaries, values)


# ----- elementwise -----


@pytest.mark.parametrize("dtype", DTYPES)
def test_maximum_minimum_and_clamp_propagate_nan(dtype):
    gen = fresh_generator(f"maximum {dtype}")
    x, y, lo = (special(6, 8, dtype=dtype, gen=gen) for _ in range(3))
    hi = lo + 2
    for fn in (torch.maximum, torch.minimum, torch.max, torch.min, torch.fmax, torch.fmin):
        check(fn, x, y)
    check(lambda a, b: torch._foreach_maximum([a], [b])[0], x, y)
    check(lambda a: a.clamp(-1, 1), x)
    check(lambda a: a.clamp(nan, 1), x)
    check(lambda a: a.clamp(-1, nan), x)
    check(lambda a: a.clamp_min(nan), x)
    check(lambda a: a.clamp_max(0.5), x)
    check(lambda a: a.clone().clamp_(min=-0.5), x)
    check(torch.clamp, x, lo, hi)
    check(lambda a, b: torch.clamp(a, min=b), x, lo)
    check(lambda a, b: torch.clamp(a, max=b), x, hi)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sign_and_nan_aware_elementwise_ops(dtype):
    gen = fresh_generator(f"elementwise {dtype}")
    # 64 elements: ATen's vectorised kernels, not its scalar tail, which
    # disagree at NaN for some activations.
    x, y = special(4, 16, dtype=dtype, gen=gen), special(4, 16, dtype=dtype, gen=gen)
    F = torch.nn.functional
    for fn in (
        torch.sign,
        torch.sgn,
        lambda a: a.clone().sign_(),
        torch.nan_to_num,
        lambda a: torch.nan_to_num(a, nan=1.5, posinf=2.0, neginf=-3.0),
        torch.isnan,
        torch.isinf,
        torch.isfinite,
        torch.isposinf,
        torch.isneginf,
        torch.signbit,
        torch.relu,
        F.relu6,
        F.hardtanh,
        lambda a: F.threshold(a, 0.5, -7.0),
        F.hardshrink,
        F.softshrink,
        F.leaky_relu,
        F.hardsigmoid,
        F.hardswish,
        lambda a: torch.logit(a, eps=0.1),
    ):
        check(fn, x)
    for fn in (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge, torch.hypot, torch.isclose,
               lambda a, b: torch.isclose(a, b, equal_nan=True)):
        check(fn, x, y)
    assert torch.allclose(x.to(DEVICE), x.to(DEVICE), equal_nan=True)
    assert not torch.allclose(x.to(DEVICE), x.to(DEVICE)), "NaN != NaN without equal_nan"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_max_pool_takes_the_last_nan_of_each_window(dtype):
    gen = fresh_generator(f"max_pool {dtype}")
    x = special(2, 3, 7, 9, dtype=dtype, gen=gen)
    F = torch.nn.functional
    for kwargs in ({"kernel_size": 2}, {"kernel_size": 3, "stride": 1}, {"kernel_size": 3, "stride": 2, "padding": 1},
                   {"kernel_size": 2, "dilation": 2, "ceil_mode": True}):
        # ATen's scan keeps the last NaN it meets: indices are exact.
        check(lambda t: F.max_pool2d(t, return_indices=True, **kwargs), x)
    check(lambda t: F.max_pool1d(t[0], 3, 1, return_indices=True), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scatter_and_index_reduce_extremes_propagate_nan(dtype):
    gen = fresh_generator(f"scatter_reduce {dtype}")
    src = special(30, dtype=dtype, gen=gen)
    self_ = special(6, dtype=dtype, gen=gen)
    index = torch.randint(0, 5, (30,), generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # index_reduce is in beta
        for reduce in ("amax", "amin"):
            for include_self in (True, False):
                check(lambda s, i, v: s.scatter_reduce(0, i, v, reduce, include_self=include_self), self_, index, src)
                check(lambda s, i, v: s.index_reduce(0, i, v, reduce, include_self=include_self), self_, index, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_through_nan_match_cpu(dtype):
    gen = fresh_generator(f"gradients {dtype}")
    x = special(4, 16, dtype=dtype, gen=gen)
    F = torch.nn.functional
    for fn in (
        torch.relu,
        lambda t: t.amax(1),
        lambda t: t.max(),
        lambda t: t.max(1).values,
        lambda t: torch.maximum(t, t.flip(1)),
        lambda t: t.clamp(-1, 1),
        lambda t: F.l1_loss(t, torch.zeros_like(t), reduction="none"),
        lambda t: t.abs(),
        lambda t: F.max_pool2d(t[None], 2),
    ):
        grads = []
        for device in (DEVICE, "cpu"):
            t = x.detach().clone().to(device).requires_grad_()
            y = fn(t)
            y.backward(torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape).to(device))
            grads.append(t.grad)
        assert_same(*grads)


def test_mask_products_keep_inf_times_zero_nan():
    x = torch.tensor([inf, -inf, nan, 2.0, -3.0])
    mask = torch.tensor([False, False, False, False, True])
    check(lambda a, m: a * m, x, mask)
    check(lambda a, m: m * a, x, mask)


# ----- OpInfo samples with NaN and Inf -----


def _ops():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
        from torch.testing._internal.opinfo.core import ReductionOpInfo
    reductions = {op_key(op) for op in op_db if isinstance(op, ReductionOpInfo)}
    reductions -= {"hash_tensor"}  # a hash of the bits, not a reduction of values
    return {op_key(op): op for op in op_db}, sorted(reductions)


OPS, REDUCTIONS = _ops()
# Besides every ReductionOpInfo: the ops whose NaN handling rtpu lowers.
NAN_OPS = REDUCTIONS + [
    "max.reduction_with_dim", "max.reduction_no_dim", "min.reduction_with_dim", "min.reduction_no_dim", "aminmax",
    "median", "nanmedian", "kthvalue", "topk", "sort", "argsort", "msort", "logsumexp", "norm.inf", "cumsum",
    "maximum", "minimum", "max.binary", "min.binary", "fmax", "fmin", "clamp", "clamp_min", "clamp_max",
    "sign", "sgn", "nan_to_num", "hypot", "bucketize", "searchsorted", "nn.functional.relu", "nn.functional.relu6",
    "nn.functional.hardtanh", "nn.functional.threshold", "nn.functional.hardshrink", "nn.functional.softshrink",
    "nn.functional.leaky_relu", "nn.functional.max_pool1d", "nn.functional.max_pool2d", "scatter_reduce.amax",
    "scatter_reduce.amin", "index_reduce.amax", "index_reduce.amin", "softmax", "log_softmax",
]
# Ops whose indices among equal values (NaN ties included) are the CPU
# kernel's own choice, and the argument that holds their dim: their values
# are compared, and the indices by what they point at.
DIM_ARG = {"kthvalue": 2, "topk": 2, "sort": 1, "argsort": 1, "median": 1, "nanmedian": 1}
# Which inputs may hold NaN: the searched sequence must stay sorted.
SORTED_ARG = {"bucketize": 1, "searchsorted": 0}
MAX_SAMPLES = 4


def _spread_samples(op, dtype):
    """The op's samples with room for NaN (4 elements or more), evenly
    spread over its list: reductions list 0-d and 2-element inputs first."""
    samples = [
        s for s in op.sample_inputs("cpu", dtype, requires_grad=False)
        if not isinstance(s.input, torch.Tensor) or s.input.numel() >= 4
    ]
    step = max(1, len(samples) // (2 * MAX_SAMPLES))
    return samples[::step]


def _dim_of(key, args, kwargs):
    if "dim" in kwargs:
        return kwargs["dim"]
    i = DIM_ARG[key]
    given = i < len(args) and isinstance(args[i], int) and not isinstance(args[i], bool)
    return args[i] if given else -1


def _on_tpu(value):
    return value.to(DEVICE) if isinstance(value, torch.Tensor) else value


def _sprinkle_tree(args, kwargs, gen, keep):
    leaves, spec = tree_flatten((args, kwargs))
    out = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel() > 0 and i != keep:
            leaf = sprinkle(leaf, gen).to(leaf.dtype)
        out.append(leaf)
    return tree_unflatten(out, spec)


# Only the dtypes CPU supports for each op: there is nothing to compare otherwise.
OPINFO_CASES = [
    (key, dtype_name)
    for key in NAN_OPS
    for dtype_name in ("float32", "bfloat16")
    if getattr(torch, dtype_name) in OPS[key].supported_dtypes("cpu")
]


@pytest.mark.parametrize("key,dtype_name", OPINFO_CASES)
def test_opinfo_samples_with_nan_and_inf_match_cpu(key, dtype_name):
    op = OPS[key]
    dtype = getattr(torch, dtype_name)
    gen = fresh_generator(f"{key} {dtype_name}")
    torch.manual_seed(gen.initial_seed())
    checked = 0
    for sample in _spread_samples(op, dtype):
        if checked == MAX_SAMPLES:
            break
        args, kwargs = _sprinkle_tree((sample.input, *sample.args), sample.kwargs, gen, SORTED_ARG.get(key, -1))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = op(*args, **kwargs)
        except Exception:
            continue  # CPU itself rejects this sample
        checked += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # index_reduce is in beta
            got = op(*tree_map(_on_tpu, args), **tree_map(_on_tpu, kwargs))
        if key in DIM_ARG and (isinstance(want, tuple) or key == "argsort"):
            assert_same_up_to_ties(got, want, args[0], _dim_of(key, args, kwargs))
        else:
            assert_same(got, want)
    if checked == 0:
        pytest.skip("no sample runs on CPU")
