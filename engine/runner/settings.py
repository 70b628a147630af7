"""The speculation settings the runner's parts share (one object, read-only)."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.kernels.philox import draft_stream


@dataclass(frozen=True)
class SpecSettings:
    """``num_speculative_tokens`` is k_max, the most drafts a request proposes per step (0: no
    draft model, plain decoding through the same sampler call). ``rejection_method`` is
    ``probabilistic`` (min(1, p/q)) or ``strict`` (accept only the target's own sample);
    ``draft_sample_method`` is ``sample`` (q kept per draft) or ``greedy`` (one-hot q, not
    stored). ``max_model_len`` bounds how far a request may draft."""

    num_speculative_tokens: int
    max_model_len: int
    rejection_method: str = "probabilistic"
    draft_sample_method: str = "sample"

    @property
    def store_probs(self) -> bool:
        """Whether each draft's q row is kept (with the request, surviving preemption): only
        probabilistic verification of sampled drafts reads it (min(1, p/q), the residual)."""
        return (self.num_speculative_tokens > 0 and self.draft_sample_method == "sample"
                and self.rejection_method == "probabilistic")

    @property
    def sampler_warm_up(self) -> tuple[int, str, bool, bool]:
        """(k_max, method, with_probs, store_probs) of the sampler's warm-up: what
        ModelRunner's warm-up and the compile workers before it (kernels/precompile.py) pass,
        so the workers compile the variants the runner meets."""
        return self.num_speculative_tokens, self.rejection_method, self.store_probs, self.store_probs

    @property
    def greedy_drafts(self) -> bool:
        return self.draft_sample_method == "greedy"

    @property
    def draft_stream(self) -> int:
        """The Philox stream drafts are raced with (kernels.philox.draft_stream): under strict
        verification the target's own stream, so each draft is coupled to the sample it must
        match."""
        return draft_stream(self.rejection_method)

    def budget(self, request, k_next: int, num_new: int) -> int:
        """Drafts ``request`` proposes after committing ``num_new`` tokens, given the k the
        controller chose for it this step (``k_next``)."""
        return request.spec_budget(min(self.num_speculative_tokens, k_next), self.max_model_len,
                                   num_new=num_new)
