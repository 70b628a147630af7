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
_checkout = (_here.parent / "engine" / "__init__.py").is_file()
if not (_here / "server").is_dir() and _checkout:
    __path__.append(str(_here.parent))  # noqa: F821 (the package's own __path__)
if _checkout:
    # a checkout (installed editable, or used from PYTHONPATH): where its root is on sys.path,
    # its kernels/ folder must not stand in for the installed package of that name that
    # transformers imports (specserve/_import_paths.py)
    from specserve._import_paths import keep_installed_kernels_package

    keep_installed_kernels_package(_here.parent)
    del keep_installed_kernels_package
del _Path, _here, _checkout
