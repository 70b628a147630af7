"""Fast torch-free unit tests: block pool, KV cache manager, scheduler, requests, detokenizer."""
