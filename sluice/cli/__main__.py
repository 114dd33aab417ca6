"""`python -m sluice.cli ...`, as the `sluice` console script."""

from sluice.cli import run

run()
