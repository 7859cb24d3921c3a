"""Other frameworks' runs as rlbench runs: TRL (a callback while it trains, or its output_dir afterwards),
verl (its file log and rollout dumps) and any per-sample length log.

lengthlog.py  the length-log format (step, group, response_tokens per group), its checks, the variance split,
              and the synchronous batch rebuilt from lengths as trace events
verl.py       verl's file logger (`{"step", "data"}` per line) and rollout_data_dir dumps -> a run
trl.py        a TrainerCallback plus a length-probe reward that writes the run while TRL trains
trl_logs.py   a finished TRL run's completions parquet and trainer_state.json
imports.py    `rlbench import`'s jobs, one function each over one checked config
run.py        a run folder from events and a length log: trace.jsonl, lengths.jsonl, metrics.json (with the
              what-if replay through the simulator) and report.html
"""
