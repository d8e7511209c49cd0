"""Serving targets of an export: onnxruntime-genai decoders, Triton model repositories, tokenizers.

The layer between :mod:`attnx.decode` and :mod:`attnx.api`: the genai decoder and the tokenizer
are exporter :class:`attnx.exporter.export.GraphExtension` objects (:data:`attnx.serve.genai.GENAI`,
:data:`attnx.serve.tokenizer.TOKENIZER`) that :mod:`attnx.api` passes, and the Triton repository
(:func:`attnx.serve.triton.write_repository`) and the target report
(:func:`attnx.serve.runtimes.serving_runtimes`) read an export through
:class:`attnx.exporter.directory.ExportDir`. See docs/deploying.md.
"""
