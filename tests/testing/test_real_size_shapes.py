"""Each real-size shape builds its released model's Hugging Face config and module (on the meta device:
no weights allocated), with the released parameter count and layer layout."""

from __future__ import annotations

import pytest

from attnx.testing import real_size

transformers = pytest.importorskip("transformers")

# parameters of each released shape (tied embeddings counted once)
PARAMETERS = {"0.8b": 752_393_024, "2b": 1_881_825_088, "lfm2-1.2b": 1_170_340_608}


@pytest.mark.parametrize("shape", sorted(PARAMETERS))
def test_the_shape_builds_with_the_released_parameter_count(shape):
    import torch

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(real_size.config(shape))
    assert model.config.model_type == real_size.SHAPES[shape]["model_type"]
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[shape]


def test_lfm2_has_the_released_layers():
    import torch

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(real_size.config("lfm2-1.2b"))
    attention = [i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention"]
    assert attention == [2, 5, 8, 10, 12, 14] and len(model.config.layer_types) == 16
    assert model.model.layers[0].feed_forward.w1.out_features == 8192  # 2/3 x block_ff_dim 12288
    assert model.model.layers[2].self_attn.k_proj.out_features == 8 * 64  # 8 kv heads of 64
    assert model.model.layers[0].conv.conv.kernel_size == (3,)
    assert model.lm_head.weight is model.model.embed_tokens.weight
