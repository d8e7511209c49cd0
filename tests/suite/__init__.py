"""The suite's own plumbing, loaded by tests/conftest.py as pytest plugins (``pytest_plugins``):
:mod:`tests.suite.scheduling` (pytest-xdist: groups of tests sharing a fixture, one compute thread per
worker) and :mod:`tests.suite.hygiene` (seeds, the random order's seed printed, global state left alone)."""
