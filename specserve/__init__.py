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

# A source checkout used without installing (``PYTHONPATH=.``, the GPU machine's runs): the
# subpackages are the folders beside this one, so they join this package's search path. An
# installed copy (wheel or editable) has them in place and is left alone.
from pathlib import Path as _Path

_here = _Path(__file__).resolve().parent
if not (_here / "server").is_dir() and (_here.parent / "engine" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821 (the package's own __path__)
del _Path, _here
