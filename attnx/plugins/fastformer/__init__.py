"""``fastformer``: additive attention (Fastformer: Additive Attention Can Be All You Need).

Per head, with scale s = 1/sqrt(d_head) and learnable vectors w_q, w_k in R^{d_head}:
alpha_i = softmax_i(w_q · q_i s), global query q = sum_i alpha_i q_i; p_i = q ⊙ k_i;
beta_i = softmax_i(w_k · p_i s), global key k = sum_i beta_i p_i; u_i = k ⊙ v_i;
output = Linear(concat_h u) + Q. Linear in the sequence length, bidirectional only.
"""

from __future__ import annotations

import dataclasses

from attnx.config import Config
from attnx.hookspecs import hookimpl
from attnx.variant import Capabilities, Tolerance, Variant


@dataclasses.dataclass(frozen=True)
class FastformerConfig(Config):
    """Options of the ``fastformer`` variant.

    Attributes:
        share_qv: reuse the projected queries as values (no value projection), as the
            official code does; the paper presents it as an optional parameter saving.
    """

    share_qv: bool = False


VARIANT = Variant(
    name="fastformer",
    summary="additive attention: global query/key pooling, element-wise interactions, O(N)",
    paper="Fastformer: Additive Attention Can Be All You Need (arXiv 2108.09084)",
    config=FastformerConfig,
    capabilities=Capabilities(causal=False, cross=False, key_padding_mask=True, decode=None, trainable=True),
    tolerance=Tolerance(atol=1e-4, rtol=1e-3),
    impl="attnx.plugins.fastformer.kernel:IMPL",
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
