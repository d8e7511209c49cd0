"""The options of the ``fastformer`` variant (no torch)."""

from __future__ import annotations

import dataclasses

from attnx.config import Config


@dataclasses.dataclass(frozen=True)
class FastformerConfig(Config):
    """Options of the ``fastformer`` variant.

    Attributes:
        share_qv: reuse the projected queries as values (no value projection), as the
            official code does; the paper presents it as an optional parameter saving.
    """

    share_qv: bool = False
