"""Helpers the built-in plugin folders share: the kernelised linear core (``linear_core``, its Triton
twin ``linear_triton``), Triton tile loads (``tiles``), the ONNX Runtime kernels' pin and head
reshapes (``ort``) and the opset of the standard ``LinearAttention`` (``standard``). No variant is
declared here."""
