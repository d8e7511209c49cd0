"""``hf_hybrid``: Hugging Face hybrid LLMs (gated linear attention, Mamba, RG-LRU or short convolutions +
a few softmax layers) and recurrent LLMs (Mamba, RWKV-4) on attnx ops.

Qwen3-Next (``qwen3_next``) and the text models of Qwen3.5 (``qwen3_5``) and Qwen3.5-MoE
(``qwen3_5_moe``): their Gated DeltaNet layers become attnx's gated delta rule (``attnx::GatedDeltaRule``,
decode ``attnx::GatedDeltaRuleStep``), their gated full-attention layers attnx's softmax attention with a
KV cache, their sparse MoE experts a dense weighted sum that exports; everything else (embeddings, norms,
rotary tables, routers, MLPs, head) runs Hugging Face's own code. Qwen4-Exp's text model (``qwen4_exp``):
Qwen3.5-MoE's layers, its QSA-indexed attention layers the same softmax attention while a sequence is at
most ``indexer_budget`` tokens (the indexer then keeps every key; exports are capped there), its gated
residual streams HF's code; per-layer n-gram embeddings refused. Kimi Linear (``kimi_linear``): its Kimi
Delta Attention layers the same rule with a decay per key channel, its multi-head latent attention layers
attnx's softmax attention (no positions), the experts of its DeepSeek-V3-style MoE the same dense sum.
Bailing (``bailing_hybrid``, Ling 3): Kimi's layers with a bounded forget gate, its MLA layers rotated
(interleaved pairs) and gated per head. MiniMax (``minimax``): its lightning attention layers the gated
rule without the delta update. Mamba2 (``mamba2``), Bamba (``bamba``), Granite 4.0-H
(``granitemoehybrid``), Nemotron-H (``nemotron_h``) and Falcon-H1 (``falcon_h1``): their Mamba2 (SSD)
mixers the additive rule with a decay per head (q = C, k = B, v = dt x) and a D skip; Mamba
(``mamba``), Falcon-Mamba (``falcon_mamba``) and Jamba (``jamba``): their Mamba1 selective scans the
additive rule with a decay per key dimension (a value of width 1 per channel). Liquid's LFM2
(``lfm2``) and LFM2-MoE (``lfm2_moe``): their gated short convolutions (C * conv(B * x)) an attnx
module with no attnx op whose decode state is the conv carry alone, their attention layers (q/k
RMSNorms) attnx's softmax attention. AI2's OLMo Hybrid (``olmo_hybrid``): its Gated DeltaNet layers
Qwen3.5's conversion with beta = 2 sigmoid(b), its attention layers (q/k RMSNorms over the whole
projections, rotary or none) attnx's softmax attention. Translated's Lara Mini (``lara_mini``): Qwen3.5's
Gated DeltaNet (the same rule), its full attention layers (no positions) attnx's softmax attention, its
experts the dense sum; its sliding-window layers are refused. Ant Group's Bailing (``bailing_hybrid``):
Kimi Delta Attention with its own forget gate, MLA with interleaved rotary and a per-head gate.
Google's RecurrentGemma (``recurrent_gemma``, Griffin): its recurrent blocks' RG-LRU the additive rule
with one decay per channel (a value of width 1 per channel, q = k = 1), its conv the carried conv, its
local attention layers attnx's softmax attention, exact up to the attention window, where the export's
lengths stop. NX-AI's xLSTM (``xlstm``): its mLSTM layers the additive rule with a decay per head
(g = log f, k scaled by exp(i)) on values with a ones column (the normaliser state), computed unstabilised.
RWKV-4 (``rwkv``): its time mix's WKV the additive rule with one value head [v, 1] per channel fed the
previous token (the bonus and the division outside), its token shifts one-tap conv carries; each block
two decode layers (time mix, channel mix), both with onnxruntime-genai decoders (a channel mix's
recurrent placeholder takes the time mix's state shape, :mod:`attnx.serve.genai`). xLSTM's and RWKV's
models drop the padding mask: their layers are handed it
(:class:`~attnx.adapters.hf_hybrid.model.HandedPadding`) while HF's forward runs (xLSTM's without its
length-dependent chunking).
One module per architecture family (``qwen.py``, ``qwen4.py``, ``kimi.py``, ``bailing.py``,
``minimax.py``, ``mamba.py``, ``lfm2.py``, ``olmo.py``, ``lara.py``, ``rgemma.py``, ``xlstm.py``,
``rwkv.py``), shared layers beside it.
See docs/importing.md.
"""

from __future__ import annotations

from attnx.adapter import Adapter
from attnx.hookspecs import hookimpl

ADAPTER = Adapter(
    name="hf_hybrid",
    summary="HF Qwen3.5/Qwen3-Next/Qwen4-Exp, Kimi Linear, Bailing, MiniMax, Mamba1/2 hybrids "
    "(Granite-H, ...), LFM2(-MoE), OLMo Hybrid, Lara Mini, RecurrentGemma, xLSTM, RWKV-4 "
    "-> gated_delta, softmax",
    library="transformers",
    impl="attnx.adapters.hf_hybrid.convert:IMPL",
)


@hookimpl
def attnx_register_adapters() -> list[Adapter]:
    return [ADAPTER]
