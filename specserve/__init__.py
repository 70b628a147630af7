"""specserve: an OpenAI-compatible LLM server built around lossless speculative decoding.

One installed namespace; the source folders stay at the repository top, mapped by ``package-dir``
in pyproject.toml:

* :mod:`specserve.server`  (``server/``)   FastAPI app, OpenAI schemas, SSE, auth, metrics, CLI
* :mod:`specserve.engine`  (``engine/``)   scheduler, paged KV cache, model runner, models
* :mod:`specserve.kernels` (``kernels/``)  Triton kernels and their plain-PyTorch twins
* :mod:`specserve.bench`   (``bench/``)    ``specserve bench``: speed against limits and peers

Imports point one way: server -> engine -> kernels; bench -> engine -> kernels.
"""

__version__ = "0.1.0"
