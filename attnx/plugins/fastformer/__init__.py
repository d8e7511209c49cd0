"""``fastformer``: additive attention (Fastformer: Additive Attention Can Be All You Need).

Per head, with scale s = 1/sqrt(d_head) and learnable vectors w_q, w_k in R^{d_head}:
alpha_i = softmax_i(w_q · q_i s), global query q = sum_i alpha_i q_i; p_i = q ⊙ k_i;
beta_i = softmax_i(w_k · p_i s), global key k = sum_i beta_i p_i; u_i = k ⊙ v_i;
output = Linear(concat_h u) + Q. Linear in the sequence length, bidirectional only.
"""

from __future__ import annotations

from attnx.hookspecs import hookimpl
from attnx.plugins.fastformer.config import FastformerConfig
from attnx.plugins.fastformer.cost import fastformer_cost
from attnx.variant import Capabilities, TestOptions, Tolerance, Variant

VARIANT = Variant(
    name="fastformer",
    summary="additive attention: global query/key pooling, element-wise interactions, O(N)",
    paper="Fastformer: Additive Attention Can Be All You Need (arXiv 2108.09084)",
    config=FastformerConfig,
    capabilities=Capabilities(causal=False, cross=False, key_padding_mask=True, decode=None, trainable=True),
    tolerance=Tolerance(atol=1e-4, rtol=1e-3),
    impl="attnx.plugins.fastformer.kernel:IMPL",
    cost=fastformer_cost,
    model_defaults={"share_layers": True},  # the paper's layer-wise parameter sharing
    testing=TestOptions(bad_options={"share_qv": "maybe"}),
)


@hookimpl
def attnx_register_variants() -> list[Variant]:
    return [VARIANT]
