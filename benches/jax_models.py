"""JAX reference for the step benchmark: trains the MLP or the small GPT of
benches/bench_step.py for a few steps with one jitted, donating train step and
prints one JSON line, {"model", "first_step_s", "median_step_s",
"peak_rss_mb", "idle_rss_mb", "peak_device_mb"}.

bench_step.py runs it as a subprocess with a Python that has `jax` installed:

    python jax_models.py --model {mlp,gpt,gpt-d512,...} --steps N --warmup W
"""

import argparse
import json
import math
import os
import statistics
import time
from functools import partial

# CPU unless the caller asks otherwise, to compare like with like.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp

from sizes import GPT_BATCH, GPT_HEADS, GPT_LAYERS, GPT_SIZES, GPT_VOCAB, MODEL_NAMES
from timing import peak_rss_mb

MLP_SIZES = [784, 1024, 1024, 10]
MLP_BATCH = 128
SGD_LR = 0.01

LAYERS, HEADS, VOCAB = GPT_LAYERS, GPT_HEADS, GPT_VOCAB
# The GPT's width and context: `main` sets them for the model asked for.
D, T = GPT_SIZES["gpt"]
HEAD_DIM = D // HEADS
ADAMW_LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 3e-3, 0.9, 0.999, 1e-8, 0.01


def linear_params(key, fan_in, fan_out):
    # Small normal init (GPT-2 style), so the initial loss is about ln(classes).
    return {"w": 0.02 * jax.random.normal(key, (fan_in, fan_out)), "b": jnp.zeros(fan_out)}


def linear(p, x):
    return x @ p["w"] + p["b"]


def layer_norm_params():
    return {"scale": jnp.ones(D), "shift": jnp.zeros(D)}


def layer_norm(p, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["shift"]


def cross_entropy(logits, labels):
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(log_probs, labels[..., None], axis=-1).mean()


def mlp_loss(params, x, labels):
    for layer in params[:-1]:
        x = jax.nn.relu(linear(layer, x))
    return cross_entropy(linear(params[-1], x), labels)


@partial(jax.jit, donate_argnums=0)
def mlp_step(params, x, labels):
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, labels)
    return jax.tree.map(lambda p, g: p - SGD_LR * g, params, grads), loss


def mlp_setup(key):
    keys = jax.random.split(key, len(MLP_SIZES) + 1)
    params = [linear_params(k, i, o) for k, i, o in zip(keys, MLP_SIZES, MLP_SIZES[1:])]
    x = jax.random.normal(keys[-2], (MLP_BATCH, MLP_SIZES[0]))
    labels = jax.random.randint(keys[-1], (MLP_BATCH,), 0, MLP_SIZES[-1])
    return mlp_step, params, (x, labels)


def attention(p, x):
    B = x.shape[0]
    q, k, v = jnp.split(linear(p, x), 3, axis=-1)
    q, k, v = (t.reshape(B, T, HEADS, HEAD_DIM).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(HEAD_DIM)
    scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, -jnp.inf)
    out = jax.nn.softmax(scores, axis=-1) @ v
    return out.transpose(0, 2, 1, 3).reshape(B, T, D)


def gpt_loss(params, tokens, targets):
    x = params["tok_emb"][tokens] + params["pos_emb"]
    for block in params["blocks"]:
        x = x + linear(block["proj"], attention(block["qkv"], layer_norm(block["ln1"], x)))
        hidden = jax.nn.gelu(linear(block["fc"], layer_norm(block["ln2"], x)), approximate=False)
        x = x + linear(block["fc_out"], hidden)
    logits = linear(params["head"], layer_norm(params["ln_f"], x))
    return cross_entropy(logits, targets)


def adamw(params, grads, opt):
    # PyTorch's AdamW: decoupled weight decay on every parameter, bias-corrected moments.
    step = opt["step"] + 1
    m = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, opt["v"], grads)
    correction1, correction2 = 1 - BETA1**step, 1 - BETA2**step

    def update(p, m, v):
        p = p * (1 - ADAMW_LR * WEIGHT_DECAY)
        return p - ADAMW_LR * (m / correction1) / (jnp.sqrt(v / correction2) + EPS)

    return jax.tree.map(update, params, m, v), {"step": step, "m": m, "v": v}


@partial(jax.jit, donate_argnums=0)
def gpt_step(state, tokens, targets):
    params, opt = state
    loss, grads = jax.value_and_grad(gpt_loss)(params, tokens, targets)
    return adamw(params, grads, opt), loss


def gpt_setup(key):
    # Four per block, then both embeddings, the head, tokens and targets.
    keys = iter(jax.random.split(key, 4 * LAYERS + 5))
    blocks = [
        {
            "ln1": layer_norm_params(),
            "qkv": linear_params(next(keys), D, 3 * D),
            "proj": linear_params(next(keys), D, D),
            "ln2": layer_norm_params(),
            "fc": linear_params(next(keys), D, 4 * D),
            "fc_out": linear_params(next(keys), 4 * D, D),
        }
        for _ in range(LAYERS)
    ]
    params = {
        "tok_emb": 0.02 * jax.random.normal(next(keys), (VOCAB, D)),
        "pos_emb": 0.02 * jax.random.normal(next(keys), (T, D)),
        "blocks": blocks,
        "ln_f": layer_norm_params(),
        "head": linear_params(next(keys), D, VOCAB),
    }
    # Separate buffers for m and v: the step donates both.
    opt = {
        "step": jnp.zeros((), jnp.int32),
        "m": jax.tree.map(jnp.zeros_like, params),
        "v": jax.tree.map(jnp.zeros_like, params),
    }
    tokens = jax.random.randint(next(keys), (GPT_BATCH, T), 0, VOCAB)
    targets = jax.random.randint(next(keys), (GPT_BATCH, T), 0, VOCAB)
    return gpt_step, (params, opt), (tokens, targets)


def time_steps(step, state, batch, steps, warmup):
    """Seconds of the first step (with compile) and median of the timed steps."""
    times = []
    for _ in range(1 + warmup + steps):
        start = time.perf_counter()
        state, loss = step(state, *batch)
        jax.block_until_ready((state, loss))
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1 + warmup :])


def main():
    parser = argparse.ArgumentParser(description="JAX reference step times for bench_step.py")
    parser.add_argument("--model", choices=MODEL_NAMES, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error("need --steps >= 1 and --warmup >= 0")

    global D, T, HEAD_DIM
    if args.model in GPT_SIZES:
        D, T = GPT_SIZES[args.model]
        HEAD_DIM = D // HEADS
    # The process before the model: JAX and its client.
    jnp.zeros(()).block_until_ready()
    idle_rss_mb = peak_rss_mb()
    setup = mlp_setup if args.model == "mlp" else gpt_setup
    step, state, batch = setup(jax.random.PRNGKey(0))
    first, median = time_steps(step, state, batch, args.steps, args.warmup)
    # The CPU client keeps no device statistics; a plugin may.
    stats = jax.local_devices()[0].memory_stats() or {}
    peak_device = stats.get("peak_bytes_in_use")
    print(
        json.dumps(
            {
                "model": args.model,
                "first_step_s": first,
                "median_step_s": median,
                "peak_rss_mb": peak_rss_mb(),
                "idle_rss_mb": idle_rss_mb,
                "peak_device_mb": None if peak_device is None else peak_device / 2**20,
            }
        )
    )


if __name__ == "__main__":
    main()
