"""Measurements behind ``specserve bench`` (issue 6), usable on their own from Python.

Each module measures one thing and returns plain numbers (dicts and dataclasses); judging them
against goals, tables, JSON and plots live in :mod:`specserve.bench.report` / ``main``.

* ``timing``     device clocks, copy bandwidth, percentiles, the environment record
* ``shapes``     Qwen3-8B-like / Qwen3-0.6B-like / Llama-3-8B-like (and tiny) configs + a full-vocabulary tokenizer
* ``engines``    loading a target/draft once and building EngineCores around them
* ``roofline``   batch-1 decode tokens/s vs bandwidth / weight bytes
* ``compiled_peer`` a compiled plain-PyTorch batch-1 decode (gpt-fast's manner) on our weights
* ``verify``     target forward over k+1 tokens vs 1, draft step vs its roofline
* ``e2e``        tokens/s with and without speculation, acceptance, speed-up vs E / (k c + 1)
* ``peer``       HF transformers ``generate(assistant_model=...)`` on the same pair
* ``serve_load`` a real ``specserve serve`` process driven at fixed concurrency over HTTP
* ``rejection_sampler`` (its own author) the fused rejection sampler's time and bytes

Imports point ``bench -> engine -> kernels``; nothing here imports ``server`` (the serve
benchmark starts the server as a separate process, like any client would).
"""
