"""One command per measured table: `python -m benchmarks.NAME`, run from the repository root; each writes
its table to results/."""
