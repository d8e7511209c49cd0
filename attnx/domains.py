"""Names of the ONNX side of the contract (no torch): attnx's op domains and the lowerings.

* ``attnx`` (:data:`DOMAIN`): one ``attnx::<Op>`` node per attention call;
* ``attnx.lib`` (:data:`LIBRARY_DOMAIN`): onnxscript helper functions the op bodies share;
* a lowering (``attnx.exporter.lowering``) carries the ops as model-local functions (``function``),
  inlined (``decomposed``) or as bare nodes for the TensorRT plugins (``plugin``), which TensorRT
  finds by op type, ``plugin_namespace`` and ``plugin_version``.
"""

from __future__ import annotations

from typing import Literal, get_args

DOMAIN = "attnx"
LIBRARY_DOMAIN = "attnx.lib"
Lowering = Literal["function", "decomposed", "plugin"]
LOWERINGS: tuple[str, ...] = get_args(Lowering)
PLUGIN_NAMESPACE = DOMAIN
PLUGIN_VERSION = "1"
