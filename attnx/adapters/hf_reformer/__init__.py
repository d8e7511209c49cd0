"""``hf_reformer``: Hugging Face ``transformers`` Reformer models, exported as attnx's ``reformer``.

``LSHSelfAttention`` and ``LocalSelfAttention`` inside ``ReformerModel``,
``ReformerModelWithLMHead`` and ``ReformerForSequenceClassification`` become attnx
``ReformerTraxAttention`` / ``ReformerLocalAttention`` ops (the trax layout HF computes) with the
layers' own projections and options; the LSH rotations HF draws at every forward are fixed from
``config.hash_seed``. ``attnx export --from hf:DIR`` loads a local ``save_pretrained`` directory
(through the ``hf`` adapter, :mod:`attnx.adapters.hf`).
See docs/importing.md.
"""

from __future__ import annotations

from attnx.adapter import Adapter
from attnx.hookspecs import hookimpl

ADAPTER = Adapter(
    name="hf_reformer",
    summary="Hugging Face Reformer (LSHSelfAttention, LocalSelfAttention) -> reformer (trax layout)",
    library="transformers",
    impl="attnx.adapters.hf_reformer.convert:IMPL",
)


@hookimpl
def attnx_register_adapters() -> list[Adapter]:
    return [ADAPTER]
