"""A plugin that calls ``sys.exit()`` when imported: attnx must report it and keep running."""

import sys

sys.exit("exiting_plugin: cannot find my license file")
