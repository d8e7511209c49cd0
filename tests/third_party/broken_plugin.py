"""A plugin whose import fails: attnx must report it and keep working."""

raise ImportError("broken_plugin needs the missing package 'flash_attn_9000'")
