"""Parity between a torch model and its exports: backends, runners, the comparison rule, reports."""
