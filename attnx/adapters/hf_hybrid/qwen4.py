"""Qwen4-Exp's text model (``qwen4_exp``, its text config ``qwen4_exp_text``), as transformers 5.24 writes it.

Qwen3.5-MoE's layers around a new residual and attention:

* the linear layers are Qwen3.5's Gated DeltaNet (``in_proj_qkv``/``z``/``b``/``a``) whose gated output norm
  takes ``output_gate_type`` (sigmoid or silu; HF's own norm runs here): :class:`GatedDeltaNet`;
* the ``indexed_attention`` layers are Qwen3.5's gated attention (q/k norms, partial rotary, output gate)
  whose keys a QSA indexer first narrows: it averages the visible keys in blocks of
  ``indexer_compress_ratio``, scores the complete blocks against the query and keeps the best
  ``indexer_budget / indexer_compress_ratio`` of them plus the incomplete tail. A query that sees at most
  ``indexer_budget`` keys keeps every complete block, so the indexer keeps every visible key and the layer
  is plain gated attention, :class:`GatedAttention` (the indexer's weights stay on it, unused). The
  adapter's :attr:`Architecture.longest` is that budget: no export is verified or served past it;
* the experts become :class:`DenseExperts` (HF's router and shared expert stay);
* the gated residuals (``hc_count`` streams mixed in and re-injected around each layer, collapsed at the
  end) and the multimodal rotary (equal rows for text) are HF's own code, which exports.

Per-layer n-gram embeddings (``ple_layer_ids``) are refused by name: they carry the last ``ngram_size - 1``
token ids and a dilated conv across decode steps, state attnx's decode graphs do not hold.
"""

from __future__ import annotations

import functools
from typing import Any

from transformers.models.qwen4_exp import modeling_qwen4_exp as q4

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.moe import DenseExperts
from attnx.adapters.hf_hybrid.qwen import linear, project_35, qk_normed_attention
from attnx.errors import AttnxError


def _check(config: Any) -> None:
    """Refuse per-layer n-gram embeddings (module docstring)."""
    if config.ple_layer_ids:
        raise AttnxError(
            f"qwen4_exp with ple_layer_ids {config.ple_layer_ids}: its per-layer n-gram embeddings carry "
            "the last token ids and a dilated conv across decode steps, which attnx's decode state does not "
            "hold; export a config with ple_layer_ids empty"
        )


QWEN4_EXP = Architecture(
    model_type="qwen4_exp",
    config_class="Qwen4ExpTextConfig",
    classes=("Qwen4ExpForCausalLM", "Qwen4ExpTextModel"),
    models=(q4.Qwen4ExpForCausalLM, q4.Qwen4ExpTextModel),
    layers={
        q4.Qwen4ExpTextGatedDeltaNet: functools.partial(linear, project_35),
        q4.Qwen4ExpTextAttention: functools.partial(qk_normed_attention, q4),
        q4.Qwen4ExpTextExperts: DenseExperts,
    },
    untraceable=(q4.Qwen4ExpTextGatedDeltaNet, q4.Qwen4ExpTextAttention, q4.Qwen4ExpTextExperts),
    rotary=q4.Qwen4ExpTextRotaryEmbedding,
    check=_check,
    layer_types=("linear_attention", "indexed_attention"),
    longest=lambda config: config.indexer_budget,
)
