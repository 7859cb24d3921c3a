"""The fault drill (`python -m faults.fault_drill`): rlbench driven as an operator meets faults, beside the
measured benchmarks but not among them (docs/faults.md)."""
