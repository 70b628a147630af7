"""The OpenAI sampling fields -> the engine's SamplingParams, with the model's generation defaults."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from specserve.engine.types import ParamError, SamplingParams
from specserve.server.errors import bad_request, from_engine_error
from specserve.server.prompt_text import check_text
from specserve.server.protocol import SamplingFields


def _logit_bias(raw: Optional[dict[str, float]]) -> Optional[dict[int, float]]:
    """JSON's string keys -> token ids (the engine checks that they are in the vocabulary)."""
    if not raw:
        return None
    try:
        return {int(key): value for key, value in raw.items()}
    except ValueError:
        raise bad_request(f"logit_bias keys must be token ids, got {sorted(raw)[:3]}", "logit_bias") from None


_DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def with_defaults(req: SamplingFields, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields the model's generation config may default: the request's own value
    when it sent one (not null), else the model's default, else the API's."""
    sent = req.model_fields_set
    return {name: getattr(req, name) if name in sent else defaults.get(name, getattr(req, name))
            for name in _DEFAULTED_FIELDS}


def sampling_params(req: SamplingFields, *, max_tokens: Optional[int], logprobs: Optional[int],
                    defaults: Optional[Mapping[str, Any]] = None) -> SamplingParams:
    """The shared sampling fields -> engine SamplingParams (engine refusals become 400s).

    ``defaults``: the model's generation defaults, for the fields the request did not send.
    """
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    for s in stop:
        check_text(s, "stop")
    knobs = with_defaults(req, defaults or {})
    try:
        return SamplingParams(
            n=req.n, temperature=knobs["temperature"], top_p=knobs["top_p"],
            top_k=knobs["top_k"] if knobs["top_k"] is not None else 0,
            min_p=knobs["min_p"] if knobs["min_p"] is not None else 0.0,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=knobs["repetition_penalty"] if knobs["repetition_penalty"] is not None else 1.0,
            logit_bias=_logit_bias(req.logit_bias),
            seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens, stop=stop,
            stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
            logprobs=logprobs, include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens)
    except ParamError as e:
        raise from_engine_error(e) from None
