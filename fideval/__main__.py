"""``python -m fideval`` (used by torchrun, which launches a module per rank)."""

from fideval.cli import main

main()
