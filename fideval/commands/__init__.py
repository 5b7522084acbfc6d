"""CLI verbs, one module per stage: plain functions that ``fideval/cli.py`` registers from its table.
Heavy imports stay inside the verbs so that ``fideval --help`` stays instant."""
