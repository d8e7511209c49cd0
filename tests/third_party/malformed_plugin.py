"""A plugin whose registration hooks return a malformed value, chosen by ``ATTNX_TEST_MALFORMED``.

attnx must report it as a failed plugin (``attnx list``/``doctor``) and keep the others working.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import attnx
from attnx.config import Config
from attnx.models import ModelSpec
from tests.third_party.sigmoid_plugin import VARIANT

CHOICE_ENV = "ATTNX_TEST_MALFORMED"
WELL_FORMED = dataclasses.replace(VARIANT, name="malformed_test")


class PlainSubclass(Config):  # no @dataclass: its annotations are not fields
    width: int = 3


VARIANTS = {
    "dict": lambda: {"name": "malformed_test"},
    "bare-variant": lambda: WELL_FORMED,
    "string": lambda: "malformed_test",
    "not-a-variant": lambda: [WELL_FORMED, "softmax"],
    "config-not-a-dataclass": lambda: [dataclasses.replace(WELL_FORMED, config=PlainSubclass)],
    "config-not-a-config": lambda: [dataclasses.replace(WELL_FORMED, config=dict)],
    "config-instance": lambda: [dataclasses.replace(WELL_FORMED, config=VARIANT.config())],
    "capabilities-dict": lambda: [dataclasses.replace(WELL_FORMED, capabilities={"causal": True})],
    "name-not-a-string": lambda: [dataclasses.replace(WELL_FORMED, name=7)],
    "sys-exit": lambda: sys.exit(3),
}
MODELS = {
    "model-config-not-a-config": lambda: [
        ModelSpec(name="malformed_model", summary="bad", config=int, impl="attnx.models:nothing")
    ],
    "model-not-a-model": lambda: [WELL_FORMED],
}


@attnx.hookimpl
def attnx_register_variants():
    return VARIANTS.get(os.environ.get(CHOICE_ENV, ""), list)()


@attnx.hookimpl
def attnx_register_models():
    return MODELS.get(os.environ.get(CHOICE_ENV, ""), list)()
