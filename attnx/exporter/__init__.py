"""torch -> ONNX export, lowerings, manifest and Polygraphy parity checks."""
