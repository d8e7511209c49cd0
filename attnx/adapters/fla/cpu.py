"""flash-linear-attention's own forward on a CPU: its Triton kernels in Triton's interpreter.

The library has no CPU path (every layer launches Triton kernels; docs/importing.md). Triton's
interpreter runs them with numpy on CPU tensors, after two changes to the *interpreter*, none to the
library, that make it run the library's code as compiled Triton does:

* **the autotuner keeps one configuration**: ``triton.autotune`` benchmarks its configurations
  through the GPU driver before anything runs; with one configuration it does not benchmark. The
  first configuration left after the library's own pruning is used (block sizes only change how a
  sum is split, i.e. float rounding);
* **loop variables are Triton tensors**: compiled Triton makes ``i`` in ``for i in range(n)`` a
  tensor, the interpreter a Python int, so the library's ``i_t.to(tl.int64)`` fails there; the
  interpreter's source rewrite (which already turns every assignment into a tensor) also converts
  each loop variable at the top of the loop body.

Both apply to the library's kernels only (functions defined in the ``fla`` package): any other
kernel, interpreted or compiled, runs as Triton ships it.

**When Triton chooses the interpreter** (read in Triton 3.9, ``runtime/jit.py``): ``triton.jit``
reads ``TRITON_INTERPRET`` (``triton.knobs.runtime.interpret``) when it *decorates* a function, not
when a kernel launches. triton.language's own helpers (``tl.cdiv``, ``tl.sigmoid``, ...) are such
functions, decorated when ``triton.language`` is first imported, and the library's kernels when
``fla`` is imported; an interpreted kernel that calls a compiled helper fails ("Cannot call
@triton.jit'd outside of the scope of a kernel"). So the interpreter must be on at both first
imports, and the functions decorated then stay as they are for the life of the process.

**What is scoped** (:func:`import_library`): ``TRITON_INTERPRET=1`` is set only around those imports
and restored as it was afterwards (unset stays unset; Triton's own ``knobs.runtime.scope()`` cannot
serve, since importing ``triton.knobs`` imports ``triton.language``): no child process inherits it,
and anything decorated later is compiled or interpreted as it would have been without attnx. It is
switched on only where this process has no CUDA and has not imported Triton yet (``attnx export
--from fla:DIR``: the loader imports the library); a process that already chose (a user's module
that imported ``fla``; the test suite, whose conftest sets ``TRITON_INTERPRET=1`` for its Triton
kernel tests) keeps its choice. What cannot be undone: in a process where attnx chose the
interpreter, triton.language's helpers stay interpreted, so a compiled Triton kernel decorated later
in it cannot call them; that process has no CUDA device to launch one on.
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from attnx.errors import AttnxError

LIBRARY = "fla"
ENV = "TRITON_INTERPRET"  # read by triton.jit when it decorates a function (Triton 3.9 knobs.runtime)


def import_library() -> None:
    """Import ``fla`` (its layers and models); without CUDA, with its kernels in Triton's interpreter
    when this process has not imported Triton yet (module docstring). Idempotent."""
    if LIBRARY not in sys.modules and "triton" not in sys.modules and not _cuda():
        with interpreter_switched_on():
            import fla  # noqa: F401  (imports triton, fla.layers and fla.models: all interpreted)
    import fla  # noqa: F401,F811

    enable()


@contextlib.contextmanager
def interpreter_switched_on() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` inside, as it was before (unset stays unset) after."""
    before = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = before


def enable() -> bool:
    """Make the library's interpreted kernels runnable (the two interpreter changes); True if the
    library's kernels run in the interpreter here, False if compiled (CUDA).

    Raises:
        AttnxError: no CUDA and the library's kernels compiled: its forward cannot run here.
    """
    if not interpreted():
        if _cuda():
            return False
        raise AttnxError(
            "flash-linear-attention's kernels were set up for a GPU and this machine has no CUDA, so its "
            "forward (the export's parity reference) cannot run: set TRITON_INTERPRET=1 before the "
            "process imports fla (its kernels then run in Triton's interpreter), or use --from fla:DIR"
        )
    _pin_autotuner()
    _tensor_loop_variables()
    return True


def interpreted() -> bool:
    """Whether this process's Triton kernels (triton.language's helpers) run in the interpreter."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.cdiv, InterpretedFunction)


def from_library(fn: Any) -> bool:
    """Whether a kernel (or the function an autotuner or heuristics wrapper holds) is the library's."""
    while hasattr(fn, "fn"):
        fn = fn.fn
    return getattr(fn, "__module__", "").partition(".")[0] == LIBRARY


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _pin_autotuner() -> None:
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner.prune_configs, "attnx_pinned", False):
        return
    prune = Autotuner.prune_configs

    def first(self, kwargs):  # type: ignore[no-untyped-def]
        configs = prune(self, kwargs)
        return configs[:1] if from_library(self.fn) else configs

    first.attnx_pinned = True  # type: ignore[attr-defined]
    Autotuner.prune_configs = first


def _tensor_loop_variables() -> None:
    from triton.runtime import interpreter

    rewriter = interpreter.FunctionRewriter
    if getattr(rewriter._transform_ast, "attnx_loop_tensors", False):
        return

    class LoopTensors(interpreter.ASTTransformer):
        """The interpreter's rewrite plus ``i = i`` (so ``i = to_tensor(i)``) at the top of each loop body."""

        def visit_For(self, node: ast.For) -> ast.For:
            node = self.generic_visit(node)
            if isinstance(node.target, ast.Name):
                name = node.target.id
                assign = ast.Assign(
                    targets=[ast.Name(id=name, ctx=ast.Store())], value=ast.Name(id=name, ctx=ast.Load())
                )
                node.body.insert(0, self.visit_Assign(assign))
            return node

    loop_tensors = LoopTensors()
    transform = rewriter._transform_ast

    def transform_ast(self, src):  # type: ignore[no-untyped-def]
        if not from_library(self.fn):
            return transform(self, src)
        self.ast_transformer = loop_tensors  # this function's rewriter only
        try:
            return transform(self, src)
        finally:
            del self.ast_transformer  # the class's (Triton's) transformer again

    transform_ast.attnx_loop_tensors = True  # type: ignore[attr-defined]
    rewriter._transform_ast = transform_ast
    library = [fn for fn in interpreter.InterpretedFunction.rewritten_fn if from_library(fn)]
    for fn in library:  # rewritten before the change: rewrite again
        del interpreter.InterpretedFunction.rewritten_fn[fn]
