"""attnx's layers point one way and a plugin folder's private modules stay its own (the
``[tool.importlinter]`` contracts in pyproject.toml).

Every import counts, function-level ones included (import-linter reads them all); imports under
``if TYPE_CHECKING:`` do not, since they never run. The first test runs every contract on attnx; the
others show each contract failing: the layers put a low layer above a high one, the private modules on a
package whose adapter imports a plugin's ``_``-prefixed module.
"""

from __future__ import annotations

import functools
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


def contracts() -> dict[str, dict]:
    """pyproject.toml's import-linter contracts by type."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["type"]: contract for contract in settings["contracts"]}


def test_every_contract_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(contracts()) == {"layers", "private_modules"}
    assert run_contract(ROOT / "pyproject.toml", monkeypatch) == 0


def test_the_check_fails_when_a_lower_layer_imports_a_higher_one(tmp_path: Path, monkeypatch) -> None:
    layers = contracts()["layers"]["layers"]
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


def test_the_check_fails_when_an_adapter_imports_a_private_plugin_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private-modules contract, as pyproject.toml states it, on a package laid out as attnx with
    one adapter importing a family's private module."""
    files = {
        "__init__.py": "",
        "adapters/__init__.py": "",
        "adapters/lib.py": "from fakeattnx.plugins.family import op\n",
        "plugins/__init__.py": "",
        "plugins/family/__init__.py": "",
        "plugins/family/op.py": "from fakeattnx.plugins.family import _chunks\n",
        "plugins/family/_chunks.py": "",
    }
    for name, text in files.items():
        (tmp_path / "fakeattnx" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fakeattnx" / name).write_text(text)
    packages = contracts()["private_modules"]["packages_with_private_modules"]
    config = tmp_path / "contract.ini"
    config.write_text(
        "[importlinter]\nroot_package = fakeattnx\n\n"
        "[importlinter:contract:private]\nname = private\ntype = private_modules\n"
        "packages_with_private_modules =\n"
        + "".join(f"    {package.replace('attnx', 'fakeattnx', 1)}\n" for package in packages)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    lint = functools.partial(lint_imports, config_filename=str(config), no_cache=True, no_logo=True)
    assert lint() == 0  # the family's own op module may import its private module
    (tmp_path / "fakeattnx/adapters/lib.py").write_text("from fakeattnx.plugins.family import _chunks\n")
    assert lint() == 1
