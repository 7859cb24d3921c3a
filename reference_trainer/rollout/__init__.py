"""Rollout strategies: synchronous (base.py), SortedRL (sorted.py), dispatch over workers (placed.py,
dispatch.py, placement.py)."""
