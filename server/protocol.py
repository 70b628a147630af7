"""Pydantic schemas of the OpenAI surface (requests, responses, stream chunks, errors). Schemas only.

Unknown request fields are ignored (pydantic's default, as vLLM does) so that real clients and load
tools that send extra fields keep working. Ranges of the standard OpenAI fields are declared here so
the OpenAPI document tells clients the limits; the engine validates everything again
(``SamplingParams.__post_init__``), and its refusals become 400s too.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from specserve.engine.types import SamplingParams

_MAX_N = SamplingParams.MAX_N
_MAX_LOGPROBS = SamplingParams.MAX_LOGPROBS
_MAX_TOP_K = 2**31 - 1  # the sampling kernels hold top_k in int32; any k >= vocab means "off"


# Request bodies are validated strictly: "4" is not an integer and "yes" / 1 are not booleans
# (a 400 names the field); JSON integers are still accepted where a number is expected.
_STRICT = ConfigDict(strict=True)


def _omit_none() -> Any:
    """A field left out of the JSON when None (vLLM extras that plain OpenAI clients never asked for)."""
    return Field(None, exclude_if=lambda v: v is None)


# ----------------------------------------------------------------------------------------- requests

class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's plus vLLM's extras).

    An explicit ``null`` means "the default", as in OpenAI's API (clients send ``"temperature": null``).
    """

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    model: Optional[str] = Field(None, description="served model name; omitted = the served model")
    n: int = Field(1, ge=1, le=_MAX_N)
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = Field(None, description="token id (as a string) -> bias")
    seed: Optional[int] = None
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    # vLLM extras that clients and load tools rely on
    top_k: Optional[int] = Field(None, ge=-1, le=_MAX_TOP_K, description="0 or -1 = off")
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = Field(False, description="add prompt and completion token ids to each choice")
    structured_outputs: Optional[dict[str, Any]] = Field(
        None, description="vLLM's constraint: exactly one of json (a schema), regex, choice, grammar, json_object")


class CompletionRequest(SamplingFields):
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]] = Field(
        ..., description="a string, a list of strings, token ids, or a list of token-id lists")
    max_tokens: Optional[int] = Field(None, ge=1, description="default: the model's max_new_tokens "
                                      "(--generation-config), else 16")
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=_MAX_LOGPROBS)
    best_of: Optional[int] = Field(None, description="only best_of == n is supported")
    suffix: Optional[str] = Field(None, description="not supported (400 when given)")
    add_special_tokens: bool = True
    response_format: Optional[dict[str, Any]] = Field(
        None, description="{'type': 'text' | 'json_object' | 'json_schema', 'json_schema': {'name', 'schema'}}")


class ContentPart(BaseModel):
    model_config = _STRICT

    type: str = Field(..., description="only 'text' parts are supported")
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = _STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[StrictStr, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = Field(None, description="an assistant message's calls")
    tool_call_id: Optional[str] = Field(None, description="a tool message: the call it answers")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    max_tokens: Optional[int] = Field(None, ge=1, deprecated=True,
                                      description="deprecated: use max_completion_tokens")
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=_MAX_LOGPROBS)
    tools: Optional[list[dict[str, Any]]] = Field(None, description="[{'type': 'function', 'function': "
                                                  "{'name', 'description', 'parameters'}}]")
    tool_choice: Optional[Union[str, dict[str, Any]]] = Field(
        None, description="'none' | 'auto' (needs --enable-auto-tool-choice) | 'required' | "
                          "{'type': 'function', 'function': {'name'}}; default auto with tools")
    parallel_tool_calls: bool = True
    response_format: Optional[dict[str, Any]] = Field(
        None, description="{'type': 'text' | 'json_object' | 'json_schema', 'json_schema': {'name', 'schema'}}")
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    chat_template: Optional[str] = Field(None, description="a Jinja chat template for this request; "
                                         "refused (400) unless the server runs with "
                                         "--trust-request-chat-template")


# ---------------------------------------------------------------------------------------- responses

class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class SpecDecodeUsage(BaseModel):
    """Per-request speculative decoding: acceptance length = 1 + accepted / drafts."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]
    acceptance_length: Optional[float]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV came from the prefix cache")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = _omit_none()
    spec_decode: Optional[SpecDecodeUsage] = _omit_none()


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = Field(
        None, description="the stop string or stop token id that ended the choice; null otherwise")
    prompt_token_ids: Optional[list[int]] = _omit_none()
    token_ids: Optional[list[int]] = _omit_none()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class CompletionStreamResponse(BaseModel):
    """One SSE ``data:`` chunk of a streamed completion (``choices`` is empty in the usage chunk)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = _omit_none()


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: Optional[list[ChatLogprobEntry]] = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = _omit_none()


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = Field(
        None, description="the stop string or stop token id that ended the choice; null otherwise")
    token_ids: Optional[list[int]] = _omit_none()


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Optional[Usage] = None
    prompt_token_ids: Optional[list[int]] = _omit_none()


class DeltaMessage(BaseModel):
    role: Optional[Literal["assistant"]] = _omit_none()
    content: Optional[str] = _omit_none()
    tool_calls: Optional[list[dict[str, Any]]] = _omit_none()


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = Field(
        None, description="the stop string or stop token id that ended the choice; null otherwise")
    token_ids: Optional[list[int]] = _omit_none()


class ChatCompletionStreamResponse(BaseModel):
    """One SSE ``data:`` chunk of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: Optional[Usage] = _omit_none()
    prompt_token_ids: Optional[list[int]] = _omit_none()


class SpeculativeInfo(BaseModel):
    method: Literal["draft_model"] = "draft_model"
    draft_model: str
    num_speculative_tokens: int
    rejection_sample_method: str
    draft_sample_method: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "specserve"
    root: str
    parent: Optional[str] = None
    max_model_len: int
    speculative: Optional[SpeculativeInfo] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeCompletionRequest(BaseModel):
    """``POST /tokenize`` with a ``prompt`` (vLLM's shape)."""

    model: Optional[str] = None
    prompt: StrictStr
    add_special_tokens: bool = True


class TokenizeChatRequest(BaseModel):
    """``POST /tokenize`` with chat ``messages``: the prompt the chat template makes of them."""

    model: Optional[str] = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = Field(False, description="the template already holds the special tokens")
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model: Optional[str] = None
    tokens: list[StrictInt]


class DetokenizeResponse(BaseModel):
    prompt: str


class HealthResponse(BaseModel):
    status: Literal["ok", "dead"]
    message: Optional[str] = _omit_none()


class VersionResponse(BaseModel):
    version: str

