"""The variant x model table every model test draws from.

``SUPPORTED`` states which models each variant must export in. It is written out by
hand (not derived) so that a new variant cannot join silently: the meta-tests in
test_matrix.py fail until it has an entry, and fail if an entry disagrees with the
variant's capabilities.
"""

from __future__ import annotations

from typing import Any

from attnx.registry import get_registry

MODELS = ("encoder", "lm", "seq2seq")
SUPPORTED: dict[str, tuple[str, ...]] = {
    "softmax": ("encoder", "lm", "seq2seq"),
    "linear": ("encoder", "lm", "seq2seq"),
    "cosformer": ("encoder", "lm", "seq2seq"),
    "reformer": ("encoder", "lm", "seq2seq"),
    "fastformer": ("encoder",),
}
# Options the model tests give a variant: a causal cosFormer needs a fixed M; reformer gets
# small LSH chunks so that the test lengths span several chunks.
VARIANT_OPTIONS: dict[str, dict[str, Any]] = {"cosformer": {"max_len": 256}, "reformer": {"chunk_size": 4}}

# attnx's own variants (third-party plugins installed in the environment have their own tests)
REGISTERED = sorted(
    name for name, v in get_registry().variants.items() if v.config.__module__.startswith("attnx.")
)
CASES = [(variant, model) for variant in REGISTERED for model in SUPPORTED.get(variant, ())]


def capabilities(variant: str) -> Any:
    return get_registry().variant(variant).capabilities


def cross_for(variant: str) -> str:
    """The cross-attention variant a seq2seq test uses: the variant itself when it can."""
    return variant if capabilities(variant).cross else "softmax"


def causal_variants() -> list[str]:
    return [v for v in REGISTERED if capabilities(v).causal]
