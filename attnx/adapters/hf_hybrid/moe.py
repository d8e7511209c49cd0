"""Sparse MoE experts of Hugging Face models as standard ops that export (dense, routing-weighted).

HF's experts modules (``@use_experts_implementation``: weights ``gate_up_proj`` (E, 2I, H) with gate
and up concatenated, ``down_proj`` (E, H, I); or, without a gate (Nemotron-H's, ``has_gate=False``),
``up_proj`` (E, I, H) and out_e = down_e(act(up_e(x)))) run a Python loop over the experts that some token
chose (``nonzero`` on the routing: data-dependent, so it cannot be traced for every input) or
``grouped_mm``, which has no ONNX translation. attnx computes every expert on every token with two
batched matmuls and weights the results by the router's top-k weights scattered into a dense
(tokens, E) matrix (zero for experts a token did not choose):

    out_t = sum_e w[t, e] down_e(act(gate_e(x_t)) up_e(x_t)),  w[t, top_k_index[t, j]] = top_k_weights[t, j]

which is HF's sum over the chosen experts, each term the same product (only the summation order
differs). It costs E/k times the expert FLOPs of a sparse kernel and reads every expert's weights
per token: right for small expert counts (the models tests train here); a gather of the chosen
experts' weights would scale better with E and is the next step for large MoE models.
"""

from __future__ import annotations

import torch
from torch import nn

from attnx.errors import AttnxError

_LAYOUT = {"is_concatenated": True, "is_transposed": False, "has_bias": False}


class DenseExperts(nn.Module):
    """HF's experts module (same parameters, same names) as a dense routing-weighted sum."""

    def __init__(self, experts: nn.Module):
        super().__init__()
        kind = type(experts).__name__
        for flag, wanted in _LAYOUT.items():
            if getattr(experts, flag, wanted) != wanted:
                raise AttnxError(
                    f"{kind} has {flag}={getattr(experts, flag)}: attnx's dense experts take concatenated "
                    "[gate; up] weights (E, 2I, H) or up weights (E, I, H), without bias; this expert "
                    "layout is not supported"
                )
        if getattr(experts, "has_post_expert_norm", False):
            raise AttnxError(
                f"{kind} normalises each expert's output; attnx's dense experts do not support it"
            )
        self.gated = getattr(experts, "has_gate", True)
        name = "gate_up_proj" if self.gated else "up_proj"
        self.register_parameter(name, getattr(experts, name))
        self.down_proj, self.act_fn, self.num_experts = experts.down_proj, experts.act_fn, experts.num_experts

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        weights = torch.zeros(
            hidden_states.shape[0], self.num_experts, dtype=top_k_weights.dtype, device=hidden_states.device
        ).scatter(1, top_k_index, top_k_weights)
        if self.gated:
            gate, up = torch.matmul(hidden_states, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
            inner = self.act_fn(gate) * up  # (E, T, I)
        else:
            inner = self.act_fn(torch.matmul(hidden_states, self.up_proj.transpose(1, 2)))
        out = torch.matmul(inner, self.down_proj.transpose(1, 2))  # (E, T, H)
        return (out * weights.transpose(0, 1)[..., None].to(out.dtype)).sum(0).to(hidden_states.dtype)
