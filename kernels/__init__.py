"""Hot-path operations: Triton kernels, each with a plain-PyTorch twin.

Import the public functions from :mod:`kernels.ops`; the backend (``torch`` reference or
``triton``) is chosen once at start-up with :func:`kernels.backend.set_backend`.
This package imports only torch (and triton, lazily): never ``engine`` or ``server``.
"""
