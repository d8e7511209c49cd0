"""Stateful decoding: KV caches (softmax) and O(1) recurrent state (linear, cosFormer).

"Transformers are RNNs" (arXiv 2006.16236, §3.4) shows that causal linear attention is an
RNN whose state is S = sum_j phi(k_j) v_j^T and Z = sum_j phi(k_j): generating token
10,000 costs what token 10 costs. ``attnx export --model lm --decode`` writes two graphs
next to ``model.onnx``, ``prefill.onnx`` (prompt -> logits + state) and ``decode.onnx``
(one token + state -> logits + next state), and describes the state in the manifest so
any runtime can drive the loop; ``attnx generate`` drives it on ONNX Runtime or torch.

Modules: :mod:`~attnx.state` (what a decodable layer declares and how it steps, torch-free),
:mod:`~attnx.decode.model` (the stateful torch graphs, each layer stepping itself),
:mod:`~attnx.decode.export`,
:mod:`~attnx.decode.runtime` (ORT/torch steppers), :mod:`~attnx.decode.generate`,
:mod:`~attnx.decode.verify` (decode parity) and :mod:`~attnx.decode.bench`
(per-token latency against position).
"""
