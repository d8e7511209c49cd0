"""A plugin that registers a variant name already taken by the sigmoid test plugin."""

import attnx
from tests.third_party.sigmoid_plugin import VARIANT


@attnx.hookimpl
def attnx_register_variants():
    return [VARIANT]
