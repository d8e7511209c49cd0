"""Small *trained* Hugging Face hybrid models (Qwen3-Next, the text models of Qwen3.5 and Qwen4-Exp, Kimi
Linear, MiniMax, Mamba2, Bamba, Granite 4.0-H, Nemotron-H, Falcon-H1, Zamba2, Mamba, Falcon-Mamba, Jamba,
LFM2, LFM2-MoE, OLMo Hybrid, Lara Mini, Bailing, RecurrentGemma, xLSTM, RWKV-4) for tests and benchmarks.

Each recipe is a small config of the architecture (a few layers mixing gated linear attention and
softmax attention, width 64, MoE with a few experts), a byte-level BPE tokenizer
trained with ``tokenizers`` on the Python documentation that ships with CPython
(``pydoc_data.topics``), and a few hundred AdamW steps of next-token training on that text on CPU.
The result is written with ``save_pretrained`` (safetensors) plus the tokenizer into
``<cache>/<arch>-<hash>``, where the hash covers the recipe and the training settings, so it is
made once per recipe and reused (``make``). ``examples/train_hf_hybrid.py`` makes them from the
command line.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from attnx.atomic import made_once

FIXTURE_VERSION = 1
VOCAB_SIZE = 512
SPECIAL = "<|endoftext|>"
PROMPT = "def fibonacci(n):\n    "  # a prompt for greedy agreement (the corpus is Python's documentation)
TRAINING: dict[str, Any] = {"steps": 300, "batch": 8, "length": 64, "lr": 3e-3, "seed": 0}

_SHARED = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "pad_token_id": 0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}

# a Mamba2 mixer's shape in small (HF's Mamba2Config names; the hybrids prefix them with mamba_)
_MAMBA_LAYER = {
    "n_heads": 4,
    "d_head": 32,
    "n_groups": 2,
    "d_state": 16,
    "d_conv": 4,
    "expand": 2,
    "chunk_size": 16,
}
_MAMBA2_NAMES = {
    "n_heads": "num_heads",
    "d_head": "head_dim",
    "d_state": "state_size",
    "d_conv": "conv_kernel",
}
_MAMBA2 = {_MAMBA2_NAMES.get(k, k): v for k, v in _MAMBA_LAYER.items()}
_MAMBA1 = {
    **{k: _SHARED[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")},
    **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
    "state_size": 16,
    "expand": 2,
    "time_step_rank": 8,
    "conv_kernel": 4,
}
_JAMBA_NAMES = {
    "d_state": "state_size",
    "d_conv": "conv_kernel",
    "expand": "expand",
    "dt_rank": "time_step_rank",
}
_TRANSFORMER = {
    k: _SHARED[k]
    for k in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
    )
}

RECIPES: dict[str, dict[str, Any]] = {
    "qwen3_next": {
        "class": "Qwen3NextForCausalLM",
        "config": "Qwen3NextConfig",
        "options": {
            **_SHARED,
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
        },
    },
    "qwen3_5": {
        "class": "Qwen3_5ForCausalLM",
        "config": "Qwen3_5TextConfig",
        "options": {
            **_SHARED,
            "tie_word_embeddings": True,
            # as Qwen3.5's released configs: multimodal rotary sections (their sum is half the rotary width)
            "rope_parameters": {
                **_SHARED["rope_parameters"],
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        },
    },
    "minimax": {
        "class": "MiniMaxForCausalLM",
        "config": "MiniMaxConfig",
        "options": {
            **{k: _SHARED[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "layer_types")},
            **{
                k: _SHARED[k]
                for k in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")
            },
            **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
            "head_dim": 16,
            "intermediate_size": 64,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "block_size": 64,  # HF's lightning block (256 in the released config): prefill crosses blocks
            "tie_word_embeddings": False,
            # the released config's residual factors differ per layer kind; these make the test see them
            "full_attn_alpha_factor": 1.5,
            "linear_attn_beta_factor": 0.7,
        },
    },
    # the released Kimi-Linear-48B's shape in small: KDA x3 + MLA (no q low rank, value heads narrower than
    # keys), DeepSeek-V3 routing over groups (4 groups of 2 experts, the best 2 groups, 2 experts), one
    # shared expert, the first layer a dense MLP
    "kimi_linear": {
        "class": "KimiLinearForCausalLM",
        "config": "KimiLinearConfig",
        "options": {
            **{k: _SHARED[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "layer_types")},
            **{k: _SHARED[k] for k in ("num_hidden_layers", "linear_conv_kernel_dim")},
            **{k: _SHARED[k] for k in ("max_position_embeddings",)},
            **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "linear_num_heads": 4,
            "linear_head_dim": 16,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "n_group": 4,
            "topk_group": 2,
            "moe_intermediate_size": 32,
            "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "tie_word_embeddings": False,
        },
    },
    "qwen3_5_moe": {
        "class": "Qwen3_5MoeForCausalLM",
        "config": "Qwen3_5MoeTextConfig",
        "options": {
            **_SHARED,
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "rope_parameters": {
                **_SHARED["rope_parameters"],
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        },
    },
    # Qwen4-Exp in small: Qwen3.5-MoE's shape with 2 gated-residual streams, a sigmoid output gate on the
    # linear layers, and a QSA indexer whose budget is the positions' reach (so it keeps every key: exact)
    "qwen4_exp": {
        "class": "Qwen4ExpForCausalLM",
        "config": "Qwen4ExpTextConfig",
        "options": {
            **_SHARED,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "indexed_attention"],
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "rope_parameters": {
                **_SHARED["rope_parameters"],
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
            "output_gate_type": "sigmoid",
            "hc_count": 2,
            "hc_lowrank": 16,
            "indexer_n_heads": 2,
            "indexer_kv_heads": 1,
            "indexer_head_dim": 16,
            "indexer_budget": _SHARED["max_position_embeddings"],
            "indexer_compress_ratio": 4,
        },
    },
    # Mamba2 (SSD) in small: 4 heads of 32 over 2 groups of B/C (each serves 2 heads), state 16, and HF's
    # chunk 16 so its reference scan crosses chunks at the tests' lengths
    "mamba2": {
        "class": "Mamba2ForCausalLM",
        "config": "Mamba2Config",
        "options": {
            **{k: _SHARED[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")},
            **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
            **_MAMBA2,
            "tie_word_embeddings": True,
        },
    },
    # Bamba: Mamba2 mixers and one attention layer (partial rotary, as the released config's 0.5)
    "bamba": {
        "class": "BambaForCausalLM",
        "config": "BambaConfig",
        "options": {
            **_TRANSFORMER,
            **{f"mamba_{k}": v for k, v in _MAMBA_LAYER.items()},
            "attn_layer_indices": [3],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            "tie_word_embeddings": False,
        },
    },
    # Granite 4.0-H in small: Mamba2 mixers, one attention layer without positions (the released
    # configs' position_embedding_type null), a MoE of 4 experts with a shared MLP, and its multipliers
    "granitemoehybrid": {
        "class": "GraniteMoeHybridForCausalLM",
        "config": "GraniteMoeHybridConfig",
        "options": {
            **_TRANSFORMER,
            **{f"mamba_{k}": v for k, v in _MAMBA_LAYER.items()},
            "layer_types": ["mamba", "mamba", "mamba", "attention"],
            "position_embedding_type": None,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
            "embedding_multiplier": 4.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.03,
            "logits_scaling": 2.0,
            "tie_word_embeddings": True,
        },
    },
    # Nemotron-H in small: Mamba2 mixers, attention without positions, relu² MLP and MoE blocks (4 non-gated
    # experts, DeepSeek-V3 routing over 2 groups with a shared expert), one block type per layer
    "nemotron_h": {
        "class": "NemotronHForCausalLM",
        "config": "NemotronHConfig",
        "options": {
            **{k: v for k, v in _TRANSFORMER.items() if k != "num_hidden_layers"},
            "layers_block_type": ["linear_attention", "moe", "linear_attention", "full_attention", "mlp"],
            "head_dim": 16,
            "mamba_num_heads": _MAMBA2["num_heads"],
            "mamba_head_dim": _MAMBA2["head_dim"],
            **{k: _MAMBA2[k] for k in ("n_groups", "conv_kernel", "expand", "chunk_size")},
            "ssm_state_size": _MAMBA2["state_size"],
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_group": 2,
            "topk_group": 1,
            "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32,
            "tie_word_embeddings": False,
        },
    },
    # Falcon-H1 in small: a Mamba2 mixer beside an attention layer in each of 3 layers, every µP multiplier
    # away from 1 (the five of in_proj's parts too), the gated norm after the gate as released
    "falcon_h1": {
        "class": "FalconH1ForCausalLM",
        "config": "FalconH1Config",
        "options": {
            **{k: v for k, v in _TRANSFORMER.items() if k != "num_hidden_layers"},
            "num_hidden_layers": 3,
            **{f"mamba_{k}": v for k, v in _MAMBA_LAYER.items()},
            "mamba_d_ssm": _MAMBA_LAYER["n_heads"] * _MAMBA_LAYER["d_head"],
            "mamba_norm_before_gate": False,
            "mamba_rms_norm": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "embedding_multiplier": 2.0,
            "lm_head_multiplier": 0.5,
            "key_multiplier": 0.7,
            "attention_in_multiplier": 0.8,
            "attention_out_multiplier": 0.9,
            "ssm_in_multiplier": 1.2,
            "ssm_out_multiplier": 0.6,
            "ssm_multipliers": [0.5, 1.5, 0.8, 1.3, 0.9],
            "mlp_multipliers": [0.7, 1.4],
            "tie_word_embeddings": False,
        },
    },
    # Zamba2 in small: 5 layers, the 2nd and 4th hybrid (one shared transformer block each: 2 memory
    # blocks, so no weights tied between them here), LoRA adapters of rank 8 on the shared attention,
    # rotary on it, Mamba2 mixers of the shape above
    "zamba2": {
        "class": "Zamba2ForCausalLM",
        "config": "Zamba2Config",
        "options": {
            **{k: v for k, v in _TRANSFORMER.items() if k not in ("num_hidden_layers", "intermediate_size")},
            "num_hidden_layers": 5,
            "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "mamba"],
            "intermediate_size": 128,
            "n_mamba_heads": _MAMBA_LAYER["n_heads"],
            "mamba_ngroups": _MAMBA_LAYER["n_groups"],
            **{f"mamba_{k}": _MAMBA_LAYER[k] for k in ("d_state", "d_conv", "expand")},
            "chunk_size": _MAMBA_LAYER["chunk_size"],
            "num_mem_blocks": 2,
            "use_shared_attention_adapter": True,
            "adapter_rank": 8,
            "use_mem_rope": True,
            "num_key_value_heads": _SHARED["num_attention_heads"],  # HF's adapters need as many as queries
            "tie_word_embeddings": True,
        },
    },
    # Mamba1 in small: 128 channels (expand 2), state 16, dt rank 8, conv kernel 4, tied embeddings
    "mamba": {
        "class": "MambaForCausalLM",
        "config": "MambaConfig",
        "options": {**_MAMBA1, "tie_word_embeddings": True},
    },
    # Falcon-Mamba: Mamba1 with weightless RMSNorms on dt, B and C
    "falcon_mamba": {
        "class": "FalconMambaForCausalLM",
        "config": "FalconMambaConfig",
        "options": {**_MAMBA1, "tie_word_embeddings": True},
    },
    # Jamba in small: Mamba1 mixers with learnt dt/B/C norms, the last layer attention (no positions), a
    # Mixtral-style MoE of 4 experts (top-2) every second layer
    "jamba": {
        "class": "JambaForCausalLM",
        "config": "JambaConfig",
        "options": {
            **_TRANSFORMER,
            "attn_layer_period": 4,
            "attn_layer_offset": 3,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            **{f"mamba_{k}": _MAMBA1[v] for k, v in _JAMBA_NAMES.items()},
            "tie_word_embeddings": False,
        },
    },
    # LFM2 in small: 3 gated short convolutions (kernel 3, no biases, as released) + 1 attention layer
    # (q/k RMSNorms); HF rounds the feed-forward width 2/3 x 128 up to a multiple of block_multiple_of
    "lfm2": {
        "class": "Lfm2ForCausalLM",
        "config": "Lfm2Config",
        "options": {
            **_TRANSFORMER,
            "layer_types": ["conv", "conv", "conv", "full_attention"],
            "conv_L_cache": 3,
            "block_multiple_of": 32,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": True,
        },
    },
    # LFM2-MoE in small: LFM2's layers, the first dense, then 4 experts (top-2) routed with sigmoid scores
    # and an expert bias, renormalised and scaled by 1.5
    "lfm2_moe": {
        "class": "Lfm2MoeForCausalLM",
        "config": "Lfm2MoeConfig",
        "options": {
            **_TRANSFORMER,
            "layer_types": ["conv", "conv", "conv", "full_attention"],
            "conv_L_cache": 3,
            "num_dense_layers": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "use_expert_bias": True,
            "norm_topk_prob": True,
            "routed_scaling_factor": 1.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": True,
        },
    },
    # OLMo Hybrid in small: Qwen's shape (3 Gated DeltaNet + 1 attention layer), beta = 2 sigmoid(b)
    # (linear_allow_neg_eigval, HF's default) and no rotary (rope_theta null, as the released checkpoints)
    "olmo_hybrid": {
        "class": "OlmoHybridForCausalLM",
        "config": "OlmoHybridConfig",
        "options": {
            **_SHARED,
            "linear_allow_neg_eigval": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": None},
            "tie_word_embeddings": False,
        },
    },
    # Lara Mini in small: Qwen3.5's Gated DeltaNet (3 layers) + 1 full attention layer without positions
    # (Qwen3's, ungated), a MoE of 4 experts (top-2, float32 softmax router) plus an ungated shared expert;
    # no sliding_attention layer (attnx does not window), so sliding_window (an int in HF's config) is unused
    "lara_mini": {
        "class": "LaraMiniForCausalLM",
        "config": "LaraMiniConfig",
        "options": {
            **{k: v for k, v in _SHARED.items() if k != "intermediate_size"},
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": True,
        },
    },
    # Bailing (Ling 3) in small: KDA x3 (the released bounded forget gate, lower bound -5) + MLA with
    # interleaved rotary on its 8 positional channels and a gate per head; the first layer a dense MLP,
    # then 8 experts routed over 4 groups (the best 2 groups, 2 experts) with a shared expert
    "bailing_hybrid": {
        "class": "BailingHybridForCausalLM",
        "config": "BailingHybridConfig",
        "options": {
            **{k: _SHARED[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "layer_types")},
            **{k: _SHARED[k] for k in ("num_hidden_layers", "max_position_embeddings")},
            **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 16,  # the KDA heads' width (the config then names the rotary width head_dim)
            "short_conv_kernel_size": 4,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "kda_safe_gate": True,
            "kda_lower_bound": -5.0,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "n_group": 4,
            "topk_group": 2,
            "moe_intermediate_size": 32,
            "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": False,
        },
    },
    # RecurrentGemma (Griffin) in small: the released block pattern (recurrent, recurrent, attention) over 4
    # layers, RG-LRU width 64 in 4 blocks of its block-diagonal gates, conv width 4, MQA local attention with
    # HF's default partial rotary 0.5 and a window of 256 (the export's length cap: room for a prompt and
    # 200 generated tokens), the logit soft-cap 30 as released
    "recurrent_gemma": {
        "class": "RecurrentGemmaForCausalLM",
        "config": "RecurrentGemmaConfig",
        "options": {
            **{
                k: _SHARED[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
            },
            **{
                k: _SHARED[k] for k in ("num_attention_heads", "pad_token_id", "bos_token_id", "eos_token_id")
            },
            "num_key_value_heads": 1,
            "block_types": ["recurrent", "recurrent", "attention"],
            "attention_window_size": 256,
            "conv1d_width": 4,
            "tie_word_embeddings": True,
        },
    },
    # xLSTM in small: 4 mLSTM blocks of 4 heads (q/k and values 16 wide: HF's cache rounds qk_dim up to a
    # multiple of 64 where its layers do not, so width x qk_dim_factor must be one), HF's chunk 16 so its
    # chunkwise kernel and its recurrent remainder both run at the tests' lengths
    "xlstm": {
        "class": "xLSTMForCausalLM",
        "config": "xLSTMConfig",
        "options": {
            **{k: _SHARED[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers")},
            **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
            "num_heads": 4,
            "qk_dim_factor": 1.0,
            "chunk_size": 16,
            "tie_word_embeddings": False,
        },
    },
    # RWKV-4 in small: 4 blocks (time mix over 64 channels, channel mix 64 -> 128 -> 64), the hidden
    # states halved after every 2nd block in inference (rescale_every: 6 in the released configs)
    "rwkv": {
        "class": "RwkvForCausalLM",
        "config": "RwkvConfig",
        "options": {
            **{
                k: _SHARED[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
            },
            **{k: _SHARED[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")},
            "context_length": _SHARED["max_position_embeddings"],
            "rescale_every": 2,
            "tie_word_embeddings": False,
        },
    },
}


def recipe_hash(arch: str, steps: int) -> str:
    """12 hex digits of the SHA-256 of the recipe, the training settings (``steps`` of them) and the
    fixture version."""
    training = {**TRAINING, "steps": steps}
    text = json.dumps([FIXTURE_VERSION, VOCAB_SIZE, training, RECIPES[arch]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root() -> Path:
    """``$ATTNX_HF_FIXTURES``, else ``~/.cache/attnx/hf-fixtures``."""
    env = os.environ.get("ATTNX_HF_FIXTURES")
    return Path(env) if env else Path.home() / ".cache" / "attnx" / "hf-fixtures"


def corpus() -> str:
    """The training text: every topic of CPython's own documentation (``pydoc_data.topics``)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def train_tokenizer() -> Any:
    """A byte-level BPE tokenizer of :data:`VOCAB_SIZE` tokens (id 0 is ``<|endoftext|>``), as a
    ``PreTrainedTokenizerFast`` that pads on the left, as decoder-only generation does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([corpus()], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=SPECIAL,
        pad_token=SPECIAL,
        bos_token=SPECIAL,
        padding_side="left",
    )


def pure_torch_gated_delta() -> None:
    """HF's own pure-torch delta rules and short convolutions in every hybrid architecture's modeling
    module, for this process (:meth:`attnx.adapters.hf_hybrid.architecture.Architecture.use_torch_fallbacks`:
    with flash-linear-attention installed, transformers binds its GPU kernels in their place at import);
    the reference of every test here, as of ``--from hf:DIR``."""
    from attnx.adapters.hf_hybrid.convert import ARCHITECTURES

    for architecture in ARCHITECTURES.values():
        architecture.use_torch_fallbacks()


def build(arch: str, **config_changes: Any) -> Any:
    """The randomly initialised model of ``arch``'s recipe (seeded), its config options changed by
    ``config_changes``."""
    import torch
    import transformers

    recipe = RECIPES[arch]
    config = getattr(transformers, recipe["config"])(**{**recipe["options"], **config_changes})
    torch.manual_seed(TRAINING["seed"])
    return getattr(transformers, recipe["class"])(config)


def doubled(arch: str) -> dict[str, Any]:
    """Config changes giving ``arch``'s recipe twice its layers, its pattern repeated: per-layer lists and
    patterns twice over, layer index lists with the second copy's indices added."""
    import transformers

    recipe = RECIPES[arch]
    options = recipe["options"]
    count = getattr(transformers, recipe["config"])(**options).num_hidden_layers
    changes: dict[str, Any] = {"num_hidden_layers": 2 * count}
    for key, value in options.items():
        if isinstance(value, list | str) and len(value) == count and key != "num_hidden_layers":
            changes[key] = value * 2
        elif isinstance(value, list) and value and all(isinstance(v, int) and 0 <= v < count for v in value):
            changes[key] = [*value, *(v + count for v in value)]
    return changes


def train(model: Any, ids: Any, steps: int, log: Any = None) -> list[float]:
    """``steps`` of next-token training of ``model`` on random windows of ``ids`` (AdamW); returns the
    losses.

    One intra-op thread: these matrices are tiny, and on a shared 2-core machine several threads
    spinning on them made a step 18 times slower (measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(model, ids, steps, log)
    finally:
        torch.set_num_threads(threads)


def _train(model: Any, ids: Any, steps: int, log: Any) -> list[float]:
    import torch

    generator = torch.Generator().manual_seed(TRAINING["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAINING["lr"], weight_decay=0.0)
    batch, length = TRAINING["batch"], TRAINING["length"]
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, TRAINING["lr"], total_steps=steps)
    model.train()
    losses = []
    for step in range(steps):
        starts = torch.randint(0, len(ids) - length - 1, (batch,), generator=generator)
        window = torch.stack([ids[s : s + length] for s in starts.tolist()])
        loss = model(input_ids=window, labels=window, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if log is not None and (step % 50 == 0 or step == steps - 1):
            log(f"{step:4d} loss {losses[-1]:.3f}")
    return losses


def make(arch: str, root: Path | None = None, log: Any = None, steps: int = TRAINING["steps"]) -> Path:
    """The ``save_pretrained`` directory of ``arch``'s model trained for ``steps`` (0: as initialised,
    seeded; the quick tests' model), with its tokenizer (made on first use, then reused).

    Made once under a lock, atomically (:func:`attnx.atomic.made_once`): a killed run leaves no half
    model, and processes asking at the same time wait for one to make it and reuse it.
    """
    import transformers

    transformers.logging.disable_progress_bar()
    pure_torch_gated_delta()  # training runs HF's forward
    final = (root or cache_root()) / f"{arch}-{recipe_hash(arch, steps)}"
    return made_once(final, functools.partial(_make, arch, log=log, steps=steps), done="config.json")


def _make(arch: str, staging: Path, log: Any, steps: int) -> None:
    """Train and save into ``staging`` (see :func:`make`)."""
    import torch

    tokenizer = train_tokenizer()
    ids = torch.tensor(tokenizer(corpus())["input_ids"], dtype=torch.long)
    model = build(arch)
    losses = train(model, ids, steps, log) if steps else []
    model.eval().save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "training.json").write_text(
        json.dumps(
            {"recipe": RECIPES[arch], "training": {**TRAINING, "steps": steps}, "losses": losses[::10]},
            indent=1,
        )
    )


def hf_greedy(model: Any, prompt: Any, new_tokens: int) -> tuple[list[int], Any]:
    """HF ``generate``'s greedy continuation of ``prompt`` (ids, (1, n)) for exactly ``new_tokens`` (no
    stop at end-of-text) and the logits it chose from at each step ((new_tokens, vocab))."""
    import torch

    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=model.config.pad_token_id,
        )
    return out.sequences[0, prompt.shape[1] :].tolist(), torch.cat(out.logits)


def layer_types(config: Any) -> list[str]:
    """The config's ``layer_types``; one "linear_attention" per layer where it has none (xLSTM: one kind)."""
    return getattr(config, "layer_types", None) or ["linear_attention"] * config.num_hidden_layers


def genai_greedy(model_dir: Path | str, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt`` in onnxruntime-genai (exactly ``new_tokens``) and tokens/s."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    total = len(prompt) + new_tokens
    params.set_search_options(do_sample=False, max_length=total, min_length=total)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    seconds = time.perf_counter() - start
    tokens = list(generator.get_sequence(0))[len(prompt) :]
    return tokens, len(tokens) / seconds


def empty_state_logits(session: Any, ids: Any, free_dim: int = 0) -> Any:
    """The logits (1, n, vocab) of any tool's causal-LM graph (its ONNX Runtime ``session``) for ``ids``
    (int64 (1, n)) from the empty state, whatever it names its inputs: a mask of ones and positions 0..n-1
    in the input's dtype and rank (equal rows where the graph takes several), zeros for every other input
    (a past state) with batch axes 1, past-length axes 0 and any other named axis ``free_dim``
    (onnxruntime-genai's builder names its state's head width)."""
    import numpy as np

    n = ids.shape[1]
    feed: dict[str, Any] = {}
    for graph_input in session.get_inputs():
        kind = graph_input.type
        dtype = np.int64 if "int64" in kind else np.bool_ if "bool" in kind else np.float32
        if graph_input.name == "input_ids":
            feed[graph_input.name] = ids
        elif graph_input.name == "attention_mask":
            feed[graph_input.name] = np.ones((1, n), dtype)
        elif graph_input.name == "position_ids":
            rows = [d if isinstance(d, int) else 1 for d in graph_input.shape[:-2]]  # Qwen3.5's 3 rows
            feed[graph_input.name] = np.broadcast_to(np.arange(n), (*rows, 1, n)).astype(np.int64)
        else:
            dims = [
                d if isinstance(d, int) else 1 if "batch" in str(d) else 0 if "past" in str(d) else free_dim
                for d in graph_input.shape
            ]
            feed[graph_input.name] = np.zeros(dims, dtype)
    return session.run(["logits"], feed)[0]


def agreement(
    expected: list[int], logits: Any, actual: list[int], tolerance: float
) -> tuple[int, int | None]:
    """How many tokens ``actual`` shares with ``expected`` (HF's greedy tokens, chosen from ``logits``), and
    the step of a legitimate float tie: the first disagreement, when HF's two best logits there are
    closer than ``tolerance``, is a tie (None when there is none).

    Raises:
        AssertionError: a disagreement where HF's choice was clear.
    """
    for step, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            top = logits[step].topk(2).values
            gap = float(top[0] - top[1])
            assert gap < tolerance, f"step {step}: {got} instead of HF's {want} (HF's top-two gap {gap:.3g})"
            return step, step
    assert len(actual) >= len(expected), f"{len(actual)} tokens, HF made {len(expected)}"
    return len(expected), None
