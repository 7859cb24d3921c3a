"""The policy model: architecture config, decoder, tokenizers, loading and the embedded model."""
