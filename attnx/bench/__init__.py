"""``attnx bench``: latency, throughput, memory and scaling of exported models per backend.

``attnx.bench(outs, ...)`` is :func:`attnx.bench.api.bench`. The package itself is
callable too: importing any ``attnx.bench.*`` module binds ``attnx.bench`` to this
package (Python sets a submodule as an attribute of its parent), which would otherwise
shadow the lazy ``attnx.bench`` function of ``attnx/__init__.py``. A module subclass
with ``__call__`` is the documented way to give a module behaviour (Python data model,
"Customizing module attribute access").
"""

from __future__ import annotations

import sys
import types
from typing import Any

from attnx.bench.api import DEFAULT_SEQ_LENS, bench
from attnx.bench.report import BenchReport, Measurement, Scaling
from attnx.bench.scaling import fit_slope

__all__ = ["DEFAULT_SEQ_LENS", "BenchReport", "Measurement", "Scaling", "bench", "fit_slope"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> BenchReport:
        return bench(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
