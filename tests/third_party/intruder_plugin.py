"""A plugin that registers a variant under a built-in's name ("softmax"): the built-in must win."""

import dataclasses

import attnx
from tests.third_party.sigmoid_plugin import VARIANT


@attnx.hookimpl
def attnx_register_variants():
    return [dataclasses.replace(VARIANT, name="softmax", summary="an impostor")]
