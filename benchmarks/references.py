"""The other libraries' pure-torch references for the gated / delta-rule family, as timed callables.

Each reference takes the inputs of :class:`gated.Inputs` (per-head layout (b, h, n, d), q/k with hk heads,
v, g, beta with hv heads) rearranged to its own layout *before* the call, so a timed run is the library's
function alone; every callable returns the output in attnx's layout (b, hv, n, dv) for the agreement
check. Sources (read in the versions pinned by the ``bench`` extra):

* Hugging Face transformers: ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``
  (models/qwen3_next; scalar decay, grouped heads by ``repeat_interleave`` inside, q scaled by
  d_k^-1/2) and ``chunk_kimi_delta_attention`` / ``recurrent_kimi_delta_attention`` (models/kimi_linear;
  per-key decay, no grouped heads: q, k repeated here).
* flash-linear-attention's naive references (``fla.ops.*.naive``): ``naive_chunk_linear_attn``,
  ``naive_chunk_simple_gla``, ``naive_recurrent_gla`` (no beta: v is scaled by beta here, as the additive
  rule does), ``delta_rule_chunkwise`` (length a multiple of its chunk), ``naive_chunk_gated_delta_rule``,
  ``naive_chunk_kda``.

A reference is listed only for the rule it computes; :func:`references` gives the ones that apply.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gated import Inputs

Reference = Callable[[], torch.Tensor]


def _token_major(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """(b, h, n, ...) -> (b, n, h, ...), contiguous."""
    return [t.transpose(1, 2).contiguous() for t in tensors]


def _grouped(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k repeated to the value heads (head i serves value heads i*r .. i*r+r-1)."""
    r = x.v.shape[1] // x.q.shape[1]
    return x.q.repeat_interleave(r, dim=1), x.k.repeat_interleave(r, dim=1)


def _head_major(out: torch.Tensor) -> torch.Tensor:
    return out.transpose(1, 2)


def _pure(function: Callable) -> Callable:
    """transformers' own torch function under its hub-kernel decorator (which calls flash-linear-attention's
    Triton kernels instead whenever fla is installed, and those need a GPU)."""
    pure = inspect.unwrap(function)
    if not pure.__code__.co_filename.startswith(
        str(importlib.util.find_spec("transformers").submodule_search_locations[0])
    ):
        raise RuntimeError(f"{function.__name__}: its pure-torch implementation was not found")
    return pure


def hf_qwen3_next(x: Inputs, recurrent: bool) -> Reference:
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen

    q, k, v, g = _token_major(x.q, x.k, x.v, x.g[..., 0])
    (beta,) = _token_major(x.beta)
    if recurrent:
        recurrence = _pure(qwen.torch_recurrent_gated_delta_rule)
        return lambda: _head_major(recurrence(q, k, v, g, beta)[0])
    chunked = _pure(qwen.torch_chunk_gated_delta_rule)
    return lambda: _head_major(chunked(q, k, v, g, beta, chunk_size=64)[0])


def hf_kimi(x: Inputs, recurrent: bool) -> Reference:
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    q, k, v, g = _token_major(*_grouped(x), x.v, x.g)
    (beta,) = _token_major(x.beta)
    if recurrent:
        recurrence = _pure(kimi.recurrent_kimi_delta_attention)
        return lambda: _head_major(recurrence(q, k, v, g, beta, None, False)[0])
    chunked = _pure(kimi.chunk_kimi_delta_attention)
    return lambda: _head_major(chunked(q, k, v, g, beta, chunk_size=64)[0])


def fla_reference(rule: str, x: Inputs) -> Reference:
    """flash-linear-attention's naive reference for ``rule`` (its own scale rules: d_k^-1/2 throughout)."""
    scale = x.scale
    if rule == "linear":
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn

        q, k, v = _token_major(*_grouped(x), x.v)
        return lambda: _head_major(naive_chunk_linear_attn(q, k, v, scale=scale))
    if rule == "gated":
        from fla.ops.simple_gla.naive import naive_chunk_simple_gla

        q, k, v, g = _token_major(*_grouped(x), x.v * x.beta[..., None], x.g[..., 0])
        return lambda: _head_major(naive_chunk_simple_gla(q, k, v, g, scale=scale)[0])
    if rule == "gla":
        from fla.ops.gla.naive import naive_recurrent_gla

        q, k, v, g = _token_major(*_grouped(x), x.v * x.beta[..., None], x.g)
        return lambda: _head_major(naive_recurrent_gla(q, k, v, g)[0])
    if rule == "delta":
        from fla.ops.delta_rule.naive import delta_rule_chunkwise

        q, k = _grouped(x)
        return lambda: delta_rule_chunkwise(q, k, x.v, x.beta, chunk_size=32)[0]
    if rule == "gated_delta":
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule

        q, k, v, g, beta = _token_major(*_grouped(x), x.v, x.g[..., 0], x.beta)
        return lambda: _head_major(naive_chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0])
    if rule == "kda":
        from fla.ops.kda.naive import naive_chunk_kda

        q, k, v, g, beta = _token_major(x.q, x.k, x.v, x.g, x.beta)
        return lambda: _head_major(naive_chunk_kda(q, k, v, g, beta, scale=scale)[0])
    raise ValueError(f"no flash-linear-attention reference for rule {rule!r}")


def fla_kernel(rule: str, x: Inputs) -> Reference:
    """flash-linear-attention's compiled chunk kernel for ``rule`` (CUDA, or its interpreter through
    ``attnx.adapters.fla.cpu``): the additive rules take v
    scaled by beta, as :func:`fla_reference` does; the kernels without grouped value heads get q, k
    repeated to them."""
    scale = x.scale
    if rule == "gated":
        from fla.ops.simple_gla import chunk_simple_gla

        q, k, v, g = _token_major(*_grouped(x), x.v * x.beta[..., None], x.g[..., 0])
        return lambda: _head_major(chunk_simple_gla(q, k, v, g, scale=scale)[0])
    if rule == "gla":
        from fla.ops.gla import chunk_gla

        q, k, v, g = _token_major(*_grouped(x), x.v * x.beta[..., None], x.g)
        return lambda: _head_major(chunk_gla(q, k, v, g, scale=scale)[0])
    if rule in ("delta", "gated_delta"):  # the delta rule is g = 0 (fla's chunk_delta_rule refuses float32)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        q, k, v, g, beta = _token_major(x.q, x.k, x.v, x.g[..., 0], x.beta)
        return lambda: _head_major(chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0])
    if rule == "kda":
        from fla.ops.kda import chunk_kda

        q, k, v, g, beta = _token_major(x.q, x.k, x.v, x.g, x.beta)
        return lambda: _head_major(chunk_kda(q, k, v, g, beta, scale=scale)[0])
    raise ValueError(f"no flash-linear-attention kernel for rule {rule!r}")


# rule -> {row name: builder}; HF has references only for the delta rules with a decay (the scalar-decay
# lightning attention exists only inside MiniMax's layer: see gated_sidebyside.py's layer rows)
HF = {
    "gated_delta": {
        "HF qwen3_next chunk": lambda x: hf_qwen3_next(x, recurrent=False),
        "HF qwen3_next recurrent": lambda x: hf_qwen3_next(x, recurrent=True),
    },
    "kda": {
        "HF kimi_linear chunk": lambda x: hf_kimi(x, recurrent=False),
        "HF kimi_linear recurrent": lambda x: hf_kimi(x, recurrent=True),
    },
}


def references(rule: str, use_fla: bool = True) -> dict[str, Callable[[Inputs], Reference]]:
    """Row name -> builder of every reference of ``rule`` that is installed here."""
    rows = dict(HF.get(rule, {})) if importlib.util.find_spec("transformers") else {}
    if use_fla and importlib.util.find_spec("fla"):
        rows["fla naive"] = lambda x: fla_reference(rule, x)
    return rows
