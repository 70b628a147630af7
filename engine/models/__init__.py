"""Decoder-only model implementations over the paged KV cache, and their weight loader."""
