"""Observe rollout servers (vLLM, SGLang) from their Prometheus metrics: bubbles of any RL stack.

scrape.py   one scrape: fetch /metrics, parse it with prometheus_client, map vLLM's or SGLang's names
sampler.py  a thread that scrapes every server on the profile's clock and appends samples.jsonl
derive.py   samples -> rollout phases and a trace in the trace.jsonl contract, so the trainer's trace
            metrics compute the bubble ratio, tail share and throughput by the same definitions
whatif.py   the observed request lengths replayed through the simulator: what SortedRL/RhymeRL would buy
nvml.py     the GPUs' utilisation and memory, sampled on the same clock (a null sampler without a GPU)

The session that runs these and writes the report is rlbench/profiling/observe.py.
"""
