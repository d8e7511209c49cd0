"""A plugin that imports but whose registration hook raises."""

import attnx


@attnx.hookimpl
def attnx_register_variants():
    raise RuntimeError("cannot read my config file")
