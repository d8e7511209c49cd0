"""Built-in attention variants, one folder per family. Each folder is an ordinary plugin registered
through the ``attnx`` entry-point group and declares one or more variants (``gated``: ``retention`` and
``gated_delta``); its maths lives in its own modules, its ``_``-prefixed ones private to it. What several
families share is in :mod:`attnx.plugins.lib`."""
