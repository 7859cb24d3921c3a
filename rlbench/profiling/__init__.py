"""Profiling: NVML GPU sampler (null fallback without a driver), py-spy wrapper, profile sessions."""
