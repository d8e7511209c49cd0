"""``attnx export --module m.py:make`` through the CLI: a user's module calling the documented step op
(``gated_delta_rule_step``, with a state input) exports and verifies (before issue 32 it printed a 97-line
torch traceback, exit 1), and a module calling an op attnx cannot export is one line naming it, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

from click.testing import CliRunner

from attnx.cli import cli
from tests.helpers import assert_one_line_error, run_cli

STEP_MODULE = """
import torch

from attnx.plugins.gated.op import gated_delta_rule_step, l2norm

B, H, N, D = 2, 2, 9, 16


class Step(torch.nn.Module):
    def forward(self, q, k, v, g, beta, state):
        return gated_delta_rule_step(l2norm(q), l2norm(k), v, g, beta, state, True, D**-0.5, 64)


def make():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=generator) for _ in range(3))
    log_decay = -torch.rand(B, H, N, 1, generator=generator)  # g <= 0
    beta = torch.rand(B, H, N, generator=generator)
    state = torch.randn(B, H, D, D, generator=generator)
    axes = {**{name: {0: "batch", 2: "seq"} for name in ("q", "k", "v", "g", "beta")}, "state": {0: "batch"}}
    return Step().eval(), (q, k, v, log_decay, beta, state), axes
"""

UNTRANSLATED_MODULE = (
    STEP_MODULE.replace("def make():", "def make_step():")
    + """

@torch.library.custom_op("attnx_test_untranslated::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class Twice(Step):
    def forward(self, q, k, v, g, beta, state):
        output, state = super().forward(q, k, v, g, beta, state)
        return twice(output), state


def make():
    _, example, axes = make_step()
    return Twice().eval(), example, axes
"""
)


def write(folder: Path, source: str) -> Path:
    path = folder / "m.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_a_module_calling_the_step_op_exports_and_verifies(tmp_path):
    module, out = write(tmp_path, STEP_MODULE), tmp_path / "out"
    args = ["export", "--module", f"{module}:make", "-o", str(out), "--seq-lens", "1,65"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    verified = CliRunner().invoke(cli, ["verify", str(out)], catch_exceptions=False)
    assert verified.exit_code == 0, verified.output


def test_an_op_attnx_cannot_export_is_one_line_exit_2(tmp_path):
    module, out = write(tmp_path, UNTRANSLATED_MODULE), tmp_path / "out"
    code, _, stderr = run_cli(["export", "--module", f"{module}:make", "-o", str(out)])
    assert_one_line_error(code, stderr, "attnx_test_untranslated", "twice", "outside aten, prims and attnx")
    assert not out.exists()  # nothing half-written
