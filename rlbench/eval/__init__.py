"""Evaluation: AIME 2024, AMC 2023, OlympiadBench, MATH-500 and Knights-and-Knaves with math-verify.

suites (manifests, loading) → prompts → backends (generation) → grading (bounded, in a process pool)
→ estimators (avg@k, pass@k, maj@k) → runner (resumable JSONL) → report (HTML).
Submodules import their heavy dependencies lazily; import them directly.
"""
