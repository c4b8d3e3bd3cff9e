"""A small decoder-only transformer in plain JAX: fp32 parameters, bf16 compute, Adam.

Parameter shardings follow Megatron over the ``model`` mesh axis (attention heads, MLP
hidden units and the vocabulary split; norms replicated); the batch splits over ``data``.
Layers are a Python loop, not ``lax.scan``: XLA's cost analysis counts a loop body once,
and the FLOPs cross-check needs every layer counted.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from tpu_worker.demo.options import ModelConfig

Params = dict[str, Any]
COMPUTE = jnp.bfloat16
DATA, MODEL = "data", "model"


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    d, f, h, e, v = config.d_model, config.d_ff, config.heads, config.head_dim, config.vocab
    keys = iter(jax.random.split(key, 3 + 4 * config.layers))

    def dense(shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) / math.sqrt(fan_in)

    return {
        "embed": dense((v, d), 1),
        "layers": [
            {
                "ln1": jnp.ones((d,), jnp.float32),
                "wqkv": dense((d, 3, h, e), d),
                "wo": dense((h, e, d), d),
                "ln2": jnp.ones((d,), jnp.float32),
                "w1": dense((d, f), d),
                "w2": dense((f, d), f),
            }
            for _ in range(config.layers)
        ],
        "ln_f": jnp.ones((d,), jnp.float32),
        "unembed": dense((d, v), d),
    }


def param_specs(config: ModelConfig) -> Params:
    layer = {
        "ln1": P(),
        "wqkv": P(None, None, MODEL, None),
        "wo": P(MODEL, None, None),
        "ln2": P(),
        "w1": P(None, MODEL),
        "w2": P(MODEL, None),
    }
    return {
        "embed": P(),
        "layers": [dict(layer) for _ in range(config.layers)],
        "ln_f": P(),
        "unembed": P(None, MODEL),
    }


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (normed * scale).astype(COMPUTE)


def loss_fn(params: Params, tokens: jax.Array, config: ModelConfig) -> jax.Array:
    """Mean next-token cross-entropy of ``tokens`` [batch, seq_len + 1]."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    t = inputs.shape[1]
    x = params["embed"].astype(COMPUTE)[inputs]
    causal = jnp.tril(jnp.ones((t, t), jnp.bool_))
    for layer in params["layers"]:
        h = _rms_norm(x, layer["ln1"])
        qkv = jnp.einsum("btd,dkhe->btkhe", h, layer["wqkv"].astype(COMPUTE))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bthe,bshe->bhts", q, k).astype(jnp.float32)
        scores = jnp.where(causal, scores / math.sqrt(config.head_dim), -1e9)
        probs = jax.nn.softmax(scores, axis=-1).astype(COMPUTE)
        attn = jnp.einsum("bhts,bshe->bthe", probs, v)
        x = x + jnp.einsum("bthe,hed->btd", attn, layer["wo"].astype(COMPUTE))
        h = _rms_norm(x, layer["ln2"])
        hidden = jax.nn.gelu(jnp.einsum("btd,df->btf", h, layer["w1"].astype(COMPUTE)))
        x = x + jnp.einsum("btf,fd->btd", hidden, layer["w2"].astype(COMPUTE))
    x = _rms_norm(x, params["ln_f"])
    logits = jnp.einsum("btd,dv->btv", x, params["unembed"].astype(COMPUTE))
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def analytic_flops_per_step(config: ModelConfig, batch: int) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward).

    Per token and layer: QKV 6d^2, output 2d^2, MLP 4d*f, attention scores and values
    4*t*d (the full t x t matrix is computed, masked, not skipped); plus 2*d*v for the
    unembedding. Elementwise work (norms, softmax, Adam) is left out, as in MFU.
    """
    d, f, t, v = config.d_model, config.d_ff, config.seq_len, config.vocab
    per_token = config.layers * (8 * d * d + 4 * d * f + 4 * t * d) + 2 * d * v
    return 3.0 * per_token * batch * t


# -- Adam ----------------------------------------------------------------------------------

B1, B2, EPS = 0.9, 0.95, 1e-8


def init_opt(params: Params) -> dict[str, Any]:
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    nu = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"mu": zeros, "nu": nu, "count": jnp.zeros((), jnp.int32)}


def train_step(
    state: dict[str, Any], tokens: jax.Array, config: ModelConfig, learning_rate: float
) -> tuple[dict[str, Any], jax.Array]:
    params, opt = state["params"], state["opt"]
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, config)
    count = opt["count"] + 1
    mu = jax.tree_util.tree_map(lambda m, g: B1 * m + (1 - B1) * g, opt["mu"], grads)
    nu = jax.tree_util.tree_map(lambda n, g: B2 * n + (1 - B2) * g * g, opt["nu"], grads)
    c1 = 1 - B1 ** count.astype(jnp.float32)
    c2 = 1 - B2 ** count.astype(jnp.float32)
    params = jax.tree_util.tree_map(
        lambda p, m, n: p - learning_rate * (m / c1) / (jnp.sqrt(n / c2) + EPS), params, mu, nu
    )
    return {"params": params, "opt": {"mu": mu, "nu": nu, "count": count}}, loss
