"""Same seed, same bytes: exports and ONNX bodies do not depend on PYTHONHASHSEED (string-hash order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Two fresh processes per export (about 40 s): the whole module runs under -m slow.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HASH_SEEDS = ("0", "3")  # they order {"num", "den"} and {"inverse", "size"} differently (onnxscript's
# If outputs and Loop carried values followed such sets)


def run_with_hash_seed(seed: str, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# One process per hash seed digests every variant's ONNX bodies and exports a tiny lm (import time is most
# of its cost, so the two tests below share it)
PROGRAM = """
    import hashlib, json, sys
    import attnx
    from attnx.exporter.lowering import function_protos
    from attnx.registry import get_registry

    bodies = {}
    for name, variant in sorted(get_registry().variants.items()):
        impl = variant.load()
        for op in (*impl.ops, *impl.decode_ops):
            for i, body in enumerate(op.bodies):
                data = b"".join(p.SerializeToString(deterministic=True) for p in function_protos(body))
                bodies[f"{name}/{op.name}/{i}"] = hashlib.sha256(data).hexdigest()
    out, variant = sys.argv[1], sys.argv[2]
    tiny = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}
    options = {**tiny, "export.seed": 3, "verify.enabled": False, **json.loads(sys.argv[3])}
    attnx.export(variant, out, model="lm", options=options)
    with open(f"{out}/model.onnx", "rb") as model:
        print(json.dumps({"bodies": bodies, "model": hashlib.sha256(model.read()).hexdigest()}))
"""


@pytest.fixture(scope="module")
def under_each_hash_seed(tmp_path_factory) -> Callable[..., list[dict[str, Any]]]:
    """``under_each_hash_seed(variant, options)`` -> what :data:`PROGRAM` printed under each of
    HASH_SEEDS, for a tiny lm of ``variant`` (made once per module)."""
    made: dict[str, list[dict[str, Any]]] = {}

    def get(variant: str, options: dict[str, Any]) -> list[dict[str, Any]]:
        key = json.dumps([variant, options], sort_keys=True)
        if key not in made:
            root = tmp_path_factory.mktemp(f"hash-seeds-{variant}")
            args = (variant, json.dumps(options))
            runs = (run_with_hash_seed(seed, PROGRAM, str(root / seed), *args) for seed in HASH_SEEDS)
            made[key] = [json.loads(stdout) for stdout in runs]
        return made[key]

    return get


def test_every_variant_body_serialises_the_same_under_any_hash_seed(under_each_hash_seed):
    first, second = (run["bodies"] for run in under_each_hash_seed("linear", {}))
    assert first and first.keys() == second.keys()
    differ = [key for key in first if first[key] != second[key]]
    assert not differ, f"ONNX bodies depend on PYTHONHASHSEED: {differ}"


@pytest.mark.parametrize(
    ("variant", "options"),
    [("linear", {}), pytest.param("cosformer", {"max_len": 64}, marks=pytest.mark.slow)],
)
def test_exports_are_byte_identical_under_any_hash_seed(under_each_hash_seed, variant, options):
    """The whole model.onnx, not only the bodies (cosformer shares linear's core; its bodies are
    compared above, its full export in the slow suite)."""
    first, second = (run["model"] for run in under_each_hash_seed(variant, options))
    assert first == second
