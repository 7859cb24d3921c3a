"""Rollout strategies: synchronous, SortedRL controllers, placement over workers, HistoSpec history."""
