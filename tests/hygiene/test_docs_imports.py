"""The documentation imports public names only: no import in README.md or docs/ names a private
(``_``-prefixed) attnx module or name, so what users copy keeps working when private code moves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PRIVATE = re.compile(r"\b(?:from|import)\s+attnx(?:\.\w+)*(?:\._\w+|\s+import\s+[^#]*\b_\w+)")


def test_the_docs_import_no_private_attnx_name():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for match in PRIVATE.finditer(line)
    ]
    assert not found, found


def test_the_rule_catches_a_private_import():
    assert PRIVATE.search("from attnx.plugins._gated_core import gated_delta_rule")
    assert PRIVATE.search("import attnx.plugins.gated._onnx")
    assert PRIVATE.search("from attnx.plugins.gated.op import _chunk")
    assert not PRIVATE.search("from attnx.plugins.gated.op import run_rule")
    assert not PRIVATE.search("attnx.plugins.gated._onnx holds the bodies")  # naming a module is no import
