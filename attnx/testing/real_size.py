"""Real-size Hugging Face models with random weights, for the real-size tests and ``benchmarks/scale.py``.

Each shape names its model type (``AutoConfig.for_model(model_type, ...)``). The released Qwen3.5 text
models': the 0.8B one (752 M parameters, 2.9 GB in float32; 254 M of them the tied 248320-token
vocabulary) and the 2B one (the same with width 2048 and an MLP of 6144: about 1.9 B parameters, 7.6 GB).
Liquid's LFM2-1.2B (``lfm2-1.2b``: 1.17 B parameters, 4.7 GB), its released ``config.json``'s facts:
16 layers, 10 gated short convolutions of kernel 3 and GQA attention (32 heads, 8 key/value heads, head
64) at layers 2, 5, 8, 10, 12, 14, width 2048, ``block_ff_dim`` 12288 auto-adjusted by HF to
2/3 x 12288 = 8192 (a multiple of 256), the tied 65536-token vocabulary, RoPE theta 1e6. Weights are drawn
with a fixed seed and saved with ``save_pretrained`` in float32 (:func:`save`, about 40 s for the 0.8B).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

QWEN35_TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "num_hidden_layers": 24,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
    },
}
LFM2_ATTENTION = (2, 5, 8, 10, 12, 14)  # the released LFM2-1.2B's full_attn_idxs
LFM2_1_2B: dict[str, Any] = {
    "model_type": "lfm2",
    "vocab_size": 65536,
    "hidden_size": 2048,
    "intermediate_size": 12288,  # block_ff_dim; HF's MLP makes it 8192 (block_auto_adjust_ff_dim)
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 256,
    "num_hidden_layers": 16,
    "layer_types": ["full_attention" if i in LFM2_ATTENTION else "conv" for i in range(16)],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "conv_L_cache": 3,
    "conv_bias": False,
    "norm_eps": 1e-5,
    "max_position_embeddings": 128000,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
}
SHAPES: dict[str, dict[str, Any]] = {
    "0.8b": {**QWEN35_TEXT, "hidden_size": 1024, "intermediate_size": 3584},
    "2b": {**QWEN35_TEXT, "hidden_size": 2048, "intermediate_size": 6144},
    "lfm2-1.2b": LFM2_1_2B,
    # the hybrid tests' toy shape (attnx.testing.hf_hybrid), to try a benchmark in seconds
    "toy": {**QWEN35_TEXT, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "layer_types": QWEN35_TEXT["layer_types"][:4], "num_attention_heads": 4,
            "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            # a rotary half of 4 channels (32 x 0.25 / 2) split over the three position axes
            "rope_parameters": {**QWEN35_TEXT["rope_parameters"], "mrope_section": [2, 1, 1]}},
}  # fmt: skip


def config(shape: str) -> Any:
    """The Hugging Face config of ``shape`` (a key of :data:`SHAPES`), of the model type it names."""
    import transformers

    settings = dict(SHAPES[shape])
    return transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)


def save(shape: str, directory: Path, seed: int = 0) -> Path:
    """Write the causal LM of ``shape`` (a key of :data:`SHAPES`) with seeded random weights to
    ``directory`` with ``save_pretrained`` (float32); returns ``directory``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(shape)).eval()
    model.save_pretrained(directory)
    return directory
