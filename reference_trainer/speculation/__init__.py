"""Speculative decoding over the reference engine: drafters (HistoSpec, SuffixDecoding, lookahead runs),
the cost model that decides when a verify pays, and the `Speculator` that attaches them to an engine as its
`Speculation` hook (engine/protocol.py). The engine runs every forward and verifies drafts exactly
(`Engine.verify`); nothing here touches its private state. The drafter table (drafters.py) names each
drafter once, with its class, title and options."""
