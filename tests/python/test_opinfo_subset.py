"""A fixed, fast subset of the OpInfo sweep (tests/python/opinfo_sweep.py):
these ops must match CPU natively on tpu, run eagerly and recorded in a step.
The full sweep writes docs/ops.md.

Left out: sort (CPU's unstable sort orders ties differently) and remainder
(bfloat16 edge cases where CPU's a - b * floor(a / b) overflows)."""

import warnings

import pytest

from opinfo_sweep import op_key, run_op

SUBSET = [
    "abs", "add", "addcmul", "addmm", "amax", "argmax", "atan2", "bmm", "cat", "clamp", "cumsum", "div.no_rounding_mode",
    "eq", "exp", "flip", "gather", "index_select", "lerp", "log_softmax", "logsumexp", "masked_fill", "maximum", "mean",
    "mm", "mul", "neg", "nn.functional.conv2d", "nn.functional.gelu", "nn.functional.layer_norm",
    "nn.functional.max_pool2d", "nn.functional.relu", "nn.functional.silu", "pow", "roll", "rsqrt",
    "sigmoid", "softmax", "stack", "sub", "sum", "tanh", "topk", "tril", "var", "where",
]


def _ops():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return {op_key(op): op for op in op_db}


OPS = _ops()


# Only the dtypes CPU supports for each op: there is nothing to compare otherwise.
CASES = [
    (key, dtype_name)
    for key in SUBSET
    for dtype_name in ("float32", "bfloat16")
    if dtype_name in {str(d).removeprefix("torch.") for d in OPS[key].supported_dtypes("cpu")}
]


@pytest.mark.parametrize("key,dtype_name", CASES)
@pytest.mark.parametrize("mode", ["eager", "step"])
def test_opinfo_sample_inputs_match_cpu_natively(key, dtype_name, mode):
    status, detail = run_op(OPS[key], dtype_name, step_mode=mode == "step")
    assert status == "pass", f"{key} {dtype_name} ({mode}): {status} {detail}"
