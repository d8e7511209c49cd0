"""Built-in attention variants. Each is an ordinary plugin registered through the
``attnx`` entry-point group; its maths lives in its own ``kernel`` module."""
