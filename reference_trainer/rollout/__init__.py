"""Rollout strategies: synchronous (base.py), SortedRL (sorted.py), placement over workers (placed.py,
placement.py)."""
