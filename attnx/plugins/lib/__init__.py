"""Helpers the built-in plugin folders share: the kernelised linear core (``linear_core``, its Triton
twin ``linear_triton``), Triton tile loads (``tiles``) and the ONNX Runtime kernels' pin and head
reshapes (``ort``). No variant is declared here."""
