"""Structured outputs: constrained decoding that keeps speculative decoding exact.

``StructuredOutputs`` (params.py, no torch) is what a request asks for; ``GrammarCompiler`` and
``GrammarState`` (grammar.py) compile it and mask logits rows. The runner applies the masks as a
logits processor (engine/runner/logits.py), to draft rows and verification rows alike.
"""

from specserve.engine.structured.params import StructuredOutputs

__all__ = ["StructuredOutputs"]
