"""Small flash-linear-attention language models trained here, for the ``fla`` adapter's tests.

Each model type of the library's causal LMs is built tiny (hidden 32, 2 layers, 2 heads, 27 tokens)
and trained for :data:`STEPS` steps on scikit-learn's 8x8 digits as 65-token sequences (a start
token naming the digit, then its 64 grey levels; examples/train_digits.py), so the weights are a
model's, not a random draw. The library's forward cannot train on a CPU in reasonable time (its
kernels run in Triton's interpreter), so the steps run through the adapted copy of the model
(``attnx.adapters.apply.apply_adapters``), which shares the library model's parameter tensors: the
library model is what gets trained and saved (``save_pretrained``). The parity tests then compare
the library's own forward with the export. Models are cached on disk (pytest's cache, keyed by
everything that decides the weights).

**Why 80 steps, not a few hundred.** A step costs 0.6 to 1.6 s on a shared 2-core CPU, so 200 steps
were 2 to 5 minutes per model type, six times over, for weights no more "trained" for the parity
tests' purpose. By 80 steps every model type's loss has fallen from ln 27 = 3.3 to below the digits'
unigram entropy (2.06 nats: what a model blind to context reaches) and for most below their in-sample
bigram entropy (1.87: the best a model reading only the previous token reaches), i.e. the layers carry
context, and the weights are far from their init (Adam, lr 3e-3). :func:`learned` asserts the first bound
on every model it trains.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from attnx.atomic import made_once

STEPS = 80
BATCH = 16
VOCAB = 27  # 17 grey levels + 10 start tokens
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": VOCAB, "fuse_cross_entropy": False}

# model_type -> (config class, options): each model type, with options that exercise the adapter.
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "linear_attn": (
        "LinearAttentionConfig",
        {"num_heads": 2, "feature_map": "hedgehog", "attn_mode": "chunk"},
    ),
    "gla": ("GLAConfig", {"num_heads": 2, "use_short_conv": True, "expand_k": 0.5}),
    # the library's chunked delta-rule kernel refuses float32 (an assertion in ChunkDeltaRuleFunction),
    # so a float32 DeltaNet runs its fused_recurrent kernel at every length
    "delta_net": ("DeltaNetConfig", {"num_heads": 2, "attn_mode": "fused_recurrent", "use_gate": True}),
    "gated_deltanet": (
        "GatedDeltaNetConfig",
        {"num_heads": 1, "num_v_heads": 2, "head_dim": 16, "expand_v": 1},
    ),
    # float32 again: the library's chunked DeltaProduct kernel refuses it (ChunkGatedDeltaProductFunction)
    "gated_deltaproduct": (
        "GatedDeltaProductConfig",
        {
            "num_heads": 2,
            "head_dim": 16,
            "expand_v": 1,
            "num_householder": 2,
            "use_forget_gate": True,
            "allow_neg_eigval": True,
            "attn_mode": "fused_recurrent",
        },
    ),
    # expand_ratio 16: 2 heads of 16 forget / 16 input channels; the model's lower bounds (default) on
    "hgrn2": ("HGRN2Config", {"expand_ratio": 16}),
    "retnet": ("RetNetConfig", {"num_heads": 2, "expand_v": 1}),
    "rwkv6": ("RWKV6Config", {"num_heads": 2, "proj_low_rank_dim": 8, "gate_low_rank_dim": 8}),
    # two heads of 16; the library's model defaults (fuse_norm: l2_norm and its GroupNorm; norm_first)
    "rwkv7": (
        "RWKV7Config",
        {
            "head_dim": 16,
            "decay_low_rank_dim": 8,
            "gate_low_rank_dim": 8,
            "a_low_rank_dim": 8,
            "v_low_rank_dim": 8,
        },
    ),
    # two groups over four heads (the torch path tiles them) and the library's SSD chunk at 64
    "mamba2": (
        "Mamba2Config",
        {"num_heads": 4, "head_dim": 16, "state_size": 16, "n_groups": 2, "chunk_size": 64},
    ),
}


def digits() -> torch.Tensor:
    """Every digit as [17 + digit, 64 pixels] (1797, 65), int64."""
    from sklearn.datasets import load_digits

    data = load_digits()
    pixels = torch.from_numpy(data.images.reshape(-1, 64).astype(np.int64))
    return torch.cat([17 + torch.from_numpy(data.target.astype(np.int64))[:, None], pixels], dim=1)


def build(model_type: str, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised tiny causal LM of ``model_type`` (seeded), ``overrides`` in its config."""
    import transformers

    from attnx.adapters.fla.cpu import import_library

    import_library()
    import fla.models

    name, options = MODELS[model_type]
    config = getattr(fla.models, name)(**{**TINY, **options, **overrides})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def train(model: torch.nn.Module, steps: int = STEPS) -> list[float]:
    """``steps`` steps of Adam on next-token loss through the adapted copy (same parameters)."""
    from attnx.adapters.apply import apply_adapters

    adapted = apply_adapters(model).module.train()
    data = digits()
    generator = torch.Generator().manual_seed(0)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        batch = data[torch.randint(0, len(data), (BATCH,), generator=generator)]
        logits = adapted(input_ids=batch[:, :-1], use_cache=False).logits
        loss = functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def unigram_entropy() -> float:
    """The digits' next-token entropy in nats without context (the marginal of every target token)."""
    counts = torch.bincount(digits()[:, 1:].flatten(), minlength=VOCAB).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def learned(losses: list[float], last: int = 10) -> float:
    """The mean of the last ``last`` losses, asserted below :func:`unigram_entropy` (it reads context)."""
    final = sum(losses[-last:]) / last
    assert final < unigram_entropy(), f"loss {final:.3f} after {len(losses)} steps: not below unigram entropy"
    return final


def key(model_type: str) -> str:
    """What decides the saved model: the library's and torch's versions and the recipe. (The adapter's
    code only changes the weights by float rounding; any trained weights serve the parity tests.)"""
    from importlib import metadata

    parts_of = [
        metadata.version("flash-linear-attention"),
        torch.__version__,
        json.dumps(MODELS[model_type]),
        json.dumps(TINY),
        str(STEPS),
        str(BATCH),
    ]
    return hashlib.sha256("\n".join(parts_of).encode()).hexdigest()[:16]


def trained(model_type: str, cache: Path) -> Path:
    """The ``save_pretrained`` directory of the trained ``model_type`` model, trained on first use (once,
    under a lock, atomically: :func:`attnx.atomic.made_once`)."""
    path = cache / f"{model_type}-{key(model_type)}"
    return made_once(path, functools.partial(_train_and_save, model_type), done="config.json")


def _train_and_save(model_type: str, staging: Path) -> None:
    model = build(model_type)
    losses = train(model)
    learned(losses)
    model.eval().save_pretrained(staging)
    (staging / "losses.json").write_text(json.dumps(losses))
