"""Fresh random model inputs from TensorSpecs (never zeros)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from attnx.models.spec import TensorSpec


def random_feed(
    specs: Sequence[TensorSpec], sizes: Mapping[str, int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One feed dict; symbolic axes take their length from ``sizes`` (e.g. batch, seq).

    Bool inputs are key-padding masks: each row keeps a random-length prefix (>= 1 token); integers are
    drawn below their ``high``, floats within their ``bounds`` where given, else from a standard normal.
    """
    feed: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(sizes[a] if isinstance(a, str) else a for a in spec.axes)
        if spec.dtype == "bool":
            lengths = rng.integers(1, shape[-1] + 1, size=shape[:-1])
            feed[spec.name] = np.arange(shape[-1]) < lengths[..., None]
        elif spec.dtype.startswith("int"):
            feed[spec.name] = rng.integers(0, spec.high or 2, size=shape).astype(spec.dtype)
        elif spec.bounds is not None:
            feed[spec.name] = rng.uniform(*spec.bounds, size=shape).astype(spec.dtype)
        else:
            feed[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return feed
