"""The official ``openai`` client against a live uvicorn: completions and chat, streaming and not,
n > 1, logprobs (checked against transformers), seed reproducibility, /v1/models."""

from __future__ import annotations

import math

import openai
import pytest
import torch

from tests.server.conftest import K, MAX_MODEL_LEN, MODEL

PROMPT = "def add(a, b):\n"
CHAT = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "print squares"}]


def test_models_lists_target_and_draft(client: openai.OpenAI, tiny_pair) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    card = models.data[0].model_dump()
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert card["speculative"]["num_speculative_tokens"] == K
    assert card["speculative"]["draft_model"] == str(tiny_pair[1].resolve())


def test_completion_non_streaming(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == MODEL
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    spec = r.usage.model_extra["spec_decode"]
    assert spec["num_drafts"] >= 1
    assert spec["num_draft_tokens"] <= K * spec["num_drafts"]
    assert spec["acceptance_length"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    # position i counts drafts whose first i + 1 tokens were accepted: never rises with i
    per_pos = spec["accepted_per_position"]
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert sum(per_pos) == spec["num_accepted_tokens"]


def test_completion_stream_matches_non_streaming(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    # accepted drafts arrive together: fewer content chunks than tokens
    assert len(finishes) < 20


def test_chat_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, messages=CHAT, max_completion_tokens=15, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 15
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_content_parts_and_deprecated_max_tokens(client: openai.OpenAI) -> None:
    parts = [{"role": "user",
              "content": [{"type": "text", "text": "print"}, {"type": "text", "text": "squares"}]}]
    joined = [{"role": "user", "content": "print\nsquares"}]
    a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=8, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=joined, max_completion_tokens=8, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_n_choices_and_seed_reproducibility(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, n=3,
              extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kw)
    b = client.completions.create(seed=1234, **kw)
    c = client.completions.create(seed=99, **kw)
    assert sorted(ch.index for ch in a.choices) == [0, 1, 2]
    texts = lambda r: [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)]  # noqa: E731
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    assert len(set(texts(a))) > 1  # the n samples differ from each other
    assert a.usage.completion_tokens == 48 and a.usage.prompt_tokens == b.usage.prompt_tokens


def test_n_choices_streaming(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, messages=CHAT, max_completion_tokens=10, temperature=0.8, n=2, seed=7,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert streamed == {ch.index: ch.message.content for ch in full.choices}


def _reference_logprobs(target_dir, prompt_ids: list[int], completion_ids: list[int]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0]  # [num_tokens, vocab]
    logp = torch.log_softmax(logits.float(), dim=-1)
    start = len(prompt_ids) - 1
    return [logp[start + i] for i in range(len(completion_ids))]


def test_completion_logprobs_match_transformers(client: openai.OpenAI, tiny_pair) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    ch = r.choices[0]
    prompt_ids, ids = ch.model_extra["prompt_token_ids"], ch.model_extra["token_ids"]
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) == 10
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    ref = _reference_logprobs(tiny_pair[0], prompt_ids, ids)
    for i, tok in enumerate(ids):
        assert lp.token_logprobs[i] == pytest.approx(ref[i][tok].item(), abs=1e-4)
        assert len(lp.top_logprobs[i]) <= 3
        # greedy: the chosen token is the most likely one
        assert lp.token_logprobs[i] == pytest.approx(max(lp.top_logprobs[i].values()), abs=1e-6)
        assert lp.token_logprobs[i] == pytest.approx(ref[i].max().item(), abs=1e-4)


def test_chat_logprobs_bytes_rebuild_the_tokens(client: openai.OpenAI, server) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    ch = r.choices[0]
    entries = ch.logprobs.content
    ids = ch.model_extra["token_ids"]
    assert len(entries) == len(ids) == 12
    for e in entries:
        assert len(e.top_logprobs) == 2 and math.isfinite(e.logprob)
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-6)
    joined = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")
    assert joined == server.engine.tokenizer.decode(ids, skip_special_tokens=False)


def test_stop_string_never_leaks_into_stream(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    free = client.completions.create(**kw).choices[0].text
    stop = free[len(free) // 2: len(free) // 2 + 3]
    assert len(stop) == 3
    expected = free[: free.index(stop)]
    full = client.completions.create(stop=[stop], **kw)
    assert full.choices[0].text == expected and full.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **kw)]
    assert "".join(pieces) == expected
