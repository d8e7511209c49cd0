"""A plugin whose hook name has a typo: pluggy's check_pending would fail for every command."""

import attnx


@attnx.hookimpl
def attnx_register_variant():
    return []
