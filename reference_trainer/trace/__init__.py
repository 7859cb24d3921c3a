"""The floor every other part stands on: the run trace (its schema and writer), the records it is stored in
(atomic writes, durable JSONL) and the metrics computed from it. Imports nothing else of the project but
`reference_trainer.errors`."""
