"""``hf``: ``attnx export --from hf:DIR``, a Hugging Face ``save_pretrained`` directory.

The directory's ``config.json`` names its ``model_type``; the adapter that converts that
architecture's layers loads it (:data:`attnx.adapters.hf.load.LOADERS`: ``reformer`` by
``hf_reformer``, ``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``, ``qwen4_exp``, ``kimi_linear``,
``minimax`` and the others of docs/importing.md by ``hf_hybrid``; ``glm5_next`` is refused with its
reason, :data:`attnx.adapters.hf.load.NOT_ADAPTED`). Before that,
what every Hugging Face directory must satisfy is checked here: safetensors weights (a pickled
``pytorch_model.bin`` is refused: unpickling runs code), readable, and a tokenizer that loads when
one is saved.
"""

from __future__ import annotations

from attnx.adapter import Adapter
from attnx.hookspecs import hookimpl

ADAPTER = Adapter(
    name="hf",
    summary="loads Hugging Face save_pretrained directories (--from hf:DIR) by model_type",
    library="transformers",
    impl="attnx.adapters.hf.load:IMPL",
    sources=("hf",),
)


@hookimpl
def attnx_register_adapters() -> list[Adapter]:
    return [ADAPTER]
