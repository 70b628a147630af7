"""Keeping a source checkout's top-level ``kernels/`` folder from shadowing an installed package.

The repository keeps ``specserve.kernels`` in a top-level folder named ``kernels/``. Where the
repository root is on ``sys.path`` (pytest puts it first for the ``tests`` package; ``python -m``
run from the checkout puts the working directory there; the GPU machine's ``PYTHONPATH=.``),
``import kernels`` finds that folder. transformers 5.25 and later depend on Hugging Face's own
``kernels`` package and import it by that name when its metadata says it is installed: the import
then found our folder and failed (``cannot import name 'CUDAProperties'``), which broke every
model load of the test suite on a fresh install.

It acts when ``specserve`` is imported, so it cannot help a process that imports the top-level
``kernels`` before specserve, or puts the checkout on ``sys.path`` only afterwards; it finds the
installed package through ``sys.path`` (not through another meta-path finder, such as an
editable install of that package).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path
from typing import Optional, Sequence


class _InstalledKernels(importlib.abc.MetaPathFinder):
    """Resolves the top-level name ``kernels`` to the installed package's spec (found once,
    imported only if something asks for it)."""

    def __init__(self, spec: importlib.machinery.ModuleSpec):
        self.spec = spec

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target=None):
        return self.spec if fullname == "kernels" and path is None else None


def keep_installed_kernels_package(root: Path) -> bool:
    """If ``root`` (a checkout holding ``kernels/``) is on ``sys.path`` and another ``kernels``
    package is installed, make ``import kernels`` find the installed one; True if it did. Our
    own code imports ``specserve.kernels``, never the top-level name."""
    if "kernels" in sys.modules or not (root / "kernels" / "__init__.py").is_file():
        return False
    others = [p for p in sys.path if Path(p or ".").resolve() != root]
    if len(others) == len(sys.path):
        return False   # the checkout is not on the path: nothing shadows
    spec = importlib.machinery.PathFinder.find_spec("kernels", others)
    if spec is None:
        return False   # no other package of that name: nothing to protect
    if any(isinstance(f, _InstalledKernels) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _InstalledKernels(spec))
    return True
