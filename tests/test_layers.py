"""attnx's layers point one way (the ``[tool.importlinter]`` contract in pyproject.toml).

Every import counts, function-level ones included (import-linter reads them all); imports under
``if TYPE_CHECKING:`` do not, since they never run. The second test shows the check failing on a
contract that puts a low layer above a high one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def run_contract(config: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.chdir(ROOT)  # the package is imported from the checkout
    return lint_imports(config_filename=str(config), no_cache=True, no_logo=True)


def test_lower_layers_never_import_higher_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_contract(ROOT / "pyproject.toml", monkeypatch) == 0


def test_the_check_fails_when_a_lower_layer_imports_a_higher_one(tmp_path: Path, monkeypatch) -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = settings["contracts"]
    layers = contract["layers"]
    # the exporter imports the registry: declared the other way round, that import is a violation
    swapped = [
        "registry" if layer == "exporter" else layer.replace("registry", "exporter") for layer in layers
    ]
    config = tmp_path / "contract.ini"
    config.write_text(
        "[importlinter]\nroot_package = attnx\nexclude_type_checking_imports = true\n\n"
        "[importlinter:contract:swapped]\nname = swapped\ntype = layers\ncontainers = attnx\n"
        "layers =\n" + "".join(f"    {layer}\n" for layer in swapped)
    )
    assert run_contract(config, monkeypatch) == 1
