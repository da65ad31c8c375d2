"""`python -m ddtree_bench` runs the CLI."""

from ddtree_bench.cli import main

main()
