"""Built-in adapters: models of other libraries taken into attnx (one entry-point module each).

See :mod:`attnx.adapter` for the contract and docs/importing.md for what each adapter covers.
"""
