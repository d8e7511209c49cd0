"""flash-linear-attention's own forward on a CPU: its Triton kernels in Triton's interpreter.

The library has no CPU path (every layer launches Triton kernels; docs/importing.md). Triton's
interpreter (``TRITON_INTERPRET=1``, read when a kernel is decorated, i.e. when ``fla`` is first
imported) runs them with numpy on CPU tensors, after two changes to the *interpreter*, none to the
library, that make it run the code as compiled Triton does:

* **the autotuner keeps one configuration**: ``triton.autotune`` benchmarks its configurations
  through the GPU driver before anything runs; with one configuration it does not benchmark. The
  first configuration left after the library's own pruning is used (block sizes only change how a
  sum is split, i.e. float rounding);
* **loop variables are Triton tensors**: compiled Triton makes ``i`` in ``for i in range(n)`` a
  tensor, the interpreter a Python int, so the library's ``i_t.to(tl.int64)`` fails there; the
  interpreter's source rewrite (which already turns every assignment into a tensor) also converts
  each loop variable at the top of the loop body.

Where it is switched on (only where the library's forward must run on a CPU, never at import):

* ``attnx export --from fla:DIR`` on a machine without CUDA: the loader calls :func:`enable` before it
  imports the library, so the export checks parity against the library's own kernels there;
* converting one of the library's modules (``attnx export --module``, ``attnx.export_module``) calls it
  too; the user's code imported ``fla`` already, so it only pins the interpreter if that process runs
  it (``TRITON_INTERPRET=1`` set before ``import fla``, as the tests' conftest does).

``TRITON_INTERPRET`` then stays set for the rest of that process: Triton reads it at every kernel
launch, not only when a kernel is decorated. Exporting anything else never imports the library nor
sets it. It is slow (seconds per layer call at a few hundred tokens), and it is the library's code.
"""

from __future__ import annotations

import ast
import os
import sys

ENV = "TRITON_INTERPRET"


def enable() -> bool:
    """Run the library's kernels in Triton's interpreter if this process has no CUDA; True if they will.

    Must run before ``fla`` is imported (the interpreter is chosen when a kernel is decorated); a
    process that imported it natively keeps its compiled kernels.
    """
    import torch

    if torch.cuda.is_available() and os.environ.get(ENV) != "1":
        return False
    if "triton.language" not in sys.modules:  # the interpreter is chosen when kernels are decorated
        os.environ[ENV] = "1"
    if os.environ.get(ENV) != "1":
        return False
    _pin_autotuner()
    _tensor_loop_variables()
    return True


def _pin_autotuner() -> None:
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner.prune_configs, "attnx_pinned", False):
        return
    prune = Autotuner.prune_configs

    def first(self, kwargs):  # type: ignore[no-untyped-def]
        return prune(self, kwargs)[:1]

    first.attnx_pinned = True  # type: ignore[attr-defined]
    Autotuner.prune_configs = first


def _tensor_loop_variables() -> None:
    from triton.runtime import interpreter

    if getattr(interpreter.FunctionRewriter.ast_transformer, "attnx_loop_tensors", False):
        return

    class LoopTensors(interpreter.ASTTransformer):
        """The interpreter's rewrite plus ``i = i`` (so ``i = to_tensor(i)``) at the top of each loop body."""

        attnx_loop_tensors = True

        def visit_For(self, node: ast.For) -> ast.For:
            node = self.generic_visit(node)
            if isinstance(node.target, ast.Name):
                name = node.target.id
                assign = ast.Assign(
                    targets=[ast.Name(id=name, ctx=ast.Store())], value=ast.Name(id=name, ctx=ast.Load())
                )
                node.body.insert(0, self.visit_Assign(assign))
            return node

    interpreter.FunctionRewriter.ast_transformer = LoopTensors()
    interpreter.InterpretedFunction.rewritten_fn.clear()
