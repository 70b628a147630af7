"""Per-request options end to end: stop strings, stop tokens, min/max tokens, logprobs, penalties,
logit_bias, and aborts at any moment. Oracles: transformers logits (fp32) and hand-written greedy
loops over them; tolerances are stated where floats are compared.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from specserve.engine.types import FinishReason, SamplingParams  # noqa: E402

MODEL = "llama"
EOS = 0                   # "<|endoftext|>" in the tiny tokenizer
TEXT_PROMPT = "def add(a, b):\n    return a + b\n\nclass Point:\n"
LOGPROB_ATOL = 1e-4       # fp32 engine vs fp32 transformers, nats


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=kw.pop("ignore_eos", True), **kw)


def hf_greedy_processed(hf, prompt: list[int], n: int,
                        process: Callable[[torch.Tensor, list[int]], torch.Tensor]) -> list[int]:
    """Greedy decoding with transformers' logits, ``process(logits [V], generated)`` applied first."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(n):
        z = process(hf.logits(MODEL, ids)[-1].clone(), out)
        tok = int(torch.argmax(z))
        out.append(tok)
        ids.append(tok)
    return out


# ---- stop strings ---------------------------------------------------------------------------

def _token_boundaries(tokenizer, tokens: list[int]) -> list[int]:
    """Character offsets in the decoded text where one token ends and the next begins."""
    cuts = []
    for i in range(1, len(tokens)):
        head = tokenizer.decode(tokens[:i], skip_special_tokens=True)
        if head and not head.endswith("\ufffd"):
            cuts.append(len(head))
    return cuts


def _spanning_stop(text: str, cuts: list[int]) -> tuple[str, int]:
    """A 4-character stop string around a token boundary whose first occurrence is there."""
    for c in cuts:
        if c < 6:
            continue
        stop = text[c - 2:c + 2]
        if len(stop) == 4 and "\ufffd" not in stop and text.find(stop) == c - 2:
            return stop, c - 2
    raise AssertionError("no usable token-spanning stop string in the reference output")


def _stream(llm, drive, prompt, params) -> tuple[list[str], object]:
    d = drive(llm.core)
    d.add("s", prompt, params)
    run = d.until_done()
    texts = [o.outputs[0].text for o in run.history["s"]]
    return texts, run.final["s"].outputs[0]


def _assert_no_partial_stop(texts: list[str], final_text: str, stop: str) -> None:
    for t in texts:
        assert final_text.startswith(t), f"streamed text {t!r} is not a prefix of the final {final_text!r}"
    for t in texts[:-1]:
        assert stop not in t
        for k in range(1, len(stop)):
            assert not t.endswith(stop[:k]), f"partial stop string {stop[:k]!r} leaked in {t!r}"


@pytest.mark.parametrize("include", [False, True], ids=["exclude_stop", "include_stop"])
def test_stop_string_spanning_tokens(include, make_llm, drive):
    llm = make_llm(MODEL)
    prompt = llm.tokenizer.encode(TEXT_PROMPT)
    [ref] = llm.generate([prompt], _greedy(40))
    ref_tokens, ref_text = ref.outputs[0].token_ids, ref.outputs[0].text
    stop, at = _spanning_stop(ref_text, _token_boundaries(llm.tokenizer, ref_tokens))

    params = _greedy(40, stop=["\u2603never", stop], include_stop_str_in_output=include)
    texts, out = _stream(llm, drive, prompt, params)
    assert out.finish_reason == FinishReason.STOP and out.stop_reason == stop
    assert out.text == (ref_text[:at + len(stop)] if include else ref_text[:at])
    assert out.token_ids == ref_tokens[:len(out.token_ids)]
    # the token that completed the stop string is the last one generated
    done = llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert stop in done and stop not in llm.tokenizer.decode(out.token_ids[:-1], skip_special_tokens=True)
    _assert_no_partial_stop(texts, out.text, stop)


def test_streamed_text_without_stop_is_monotone(make_llm, drive):
    llm = make_llm(MODEL)
    prompt = llm.tokenizer.encode(TEXT_PROMPT)
    texts, out = _stream(llm, drive, prompt, _greedy(30))
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True).rstrip("\ufffd")


def test_each_steps_output_keeps_its_token_ids_and_logprobs_after_later_steps(make_llm, drive):
    """Outputs are cumulative snapshots taken without copying (GrowingView): the ones reported
    at earlier steps still hold exactly the tokens and logprobs they had then."""
    llm = make_llm(MODEL)
    prompt = llm.tokenizer.encode(TEXT_PROMPT)
    d = drive(llm.core)
    d.add("s", prompt, _greedy(20, logprobs=2))
    run = d.until_done()
    history = [o.outputs[0] for o in run.history["s"]]
    final = run.final["s"].outputs[0]
    assert len(history) > 3
    for comp in history:
        n = len(comp.token_ids)
        assert comp.token_ids == final.token_ids[:n] and list(comp.token_ids) == final.token_ids[:n]
        assert len(comp.logprobs) == n and comp.logprobs[:] == final.logprobs[:n]
    assert len({len(c.token_ids) for c in history}) == len(history)   # each step adds tokens


def test_final_only_requests_report_once_with_the_streamed_result(make_llm, prompts):
    """``add_request(final_only=True)`` (what LLM.generate asks): no output until every sequence
    of the request has finished, then one output equal to the last cumulative output of the same
    request run beside it; an abort still reports it; everything is freed."""
    llm = make_llm(MODEL)
    core = llm.core
    ps = prompts([12, 20], seed=41)
    # three sequences that stop on different tokens, so they finish in different steps
    seeded = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True, logprobs=1,
                            stop_token_ids=list(range(1, 300, 7)))
    for tag, final_only in (("each", False), ("final", True)):
        core.add_request(f"{tag}-greedy", ps[0], _greedy(9, stop=["zzzz"]), final_only=final_only)
        core.add_request(f"{tag}-pair", ps[1], seeded, final_only=final_only)
    core.add_request("gone", ps[0], _greedy(30), final_only=True)
    seen: dict[str, list] = {}
    for step in range(200):
        if not core.has_unfinished():
            break
        outs, _ = core.step()
        for o in outs:
            seen.setdefault(o.request_id, []).append(o)
        if step == 2:
            (aborted,) = core.abort(["gone"])
            assert aborted.finished and aborted.outputs[0].finish_reason == FinishReason.ABORT
    assert not core.has_unfinished()
    assert "gone" not in seen
    for name in ("greedy", "pair"):
        each, final = seen[f"each-{name}"], seen[f"final-{name}"]
        assert len(each) > 2 and len(final) == 1 and final[0].finished
        a, b = each[-1], final[0]
        assert [c.text for c in a.outputs] == [c.text for c in b.outputs]
        assert [list(c.token_ids) for c in a.outputs] == [list(c.token_ids) for c in b.outputs]
        assert [c.finish_reason for c in a.outputs] == [c.finish_reason for c in b.outputs]
        for ca, cb in zip(a.outputs, b.outputs):   # (rows of another batch: float noise only)
            assert (ca.logprobs is None) == (cb.logprobs is None)
            for la, lb in zip(ca.logprobs or [], cb.logprobs or []):
                assert la.token_id == lb.token_id and abs(la.logprob - lb.logprob) <= LOGPROB_ATOL
            assert len(ca.logprobs or []) == len(cb.logprobs or [])
    assert not core.scheduler.requests and core.kv.pool.num_free == core.kv.num_blocks


def test_llm_generate_reads_final_outputs_only(make_llm, prompts):
    """LLM.generate gives each prompt its finished output (its requests are final-only)."""
    llm = make_llm(MODEL)
    ps = prompts([10, 15], seed=43)
    step, returned = llm.core.step, []

    def spy():
        outputs, stats = step()
        returned.extend(outputs)
        return outputs, stats
    llm.core.step = spy
    outs = llm.generate(ps, _greedy(7))
    assert len(returned) == 2 and all(o.finished for o in returned)   # nothing before the end
    assert [o.request_id for o in outs] == sorted(o.request_id for o in outs)
    assert all(o.finished and len(o.outputs[0].token_ids) == 7 for o in outs)


def _first_new_token(tokens: list[int], start: int) -> int:
    for i in range(start, len(tokens)):
        if tokens[i] not in tokens[:i] and tokens[i] != EOS:
            return i
    raise AssertionError("no fresh token in the reference output")


def test_stop_token_ids(make_llm):
    llm = make_llm(MODEL)
    prompt = llm.tokenizer.encode(TEXT_PROMPT)
    ref = llm.generate([prompt], _greedy(24))[0].outputs[0].token_ids
    i = _first_new_token(ref, 4)
    [out] = llm.generate([prompt], _greedy(24, stop_token_ids=[ref[i]]))
    comp = out.outputs[0]
    assert comp.token_ids == ref[:i + 1]
    assert comp.finish_reason == FinishReason.STOP and comp.stop_reason == ref[i]


def test_stop_token_text_is_not_in_the_output_unless_asked(make_llm):
    """vLLM semantics: the stop token stays in token_ids, its text only with include_stop_str_in_output."""
    llm = make_llm(MODEL)
    prompt = llm.tokenizer.encode(TEXT_PROMPT)
    ref = llm.generate([prompt], _greedy(24))[0].outputs[0].token_ids
    i = _first_new_token(ref, 4)
    out, kept = llm.generate([prompt, prompt], [
        _greedy(24, stop_token_ids=[ref[i]]),
        _greedy(24, stop_token_ids=[ref[i]], include_stop_str_in_output=True)])
    decode = lambda ids: llm.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")  # noqa: E731
    assert kept.outputs[0].text == decode(ref[:i + 1])
    assert out.outputs[0].text == decode(ref[:i])


def test_min_tokens_holds_back_eos_and_stop_tokens(make_llm):
    llm = make_llm(MODEL)
    prompt = llm.tokenizer.encode(TEXT_PROMPT)
    forced_eos = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=4, logit_bias={EOS: 100.0})
    [out] = llm.generate([prompt], forced_eos)
    comp = out.outputs[0]
    assert len(comp.token_ids) == 5 and comp.token_ids[-1] == EOS and EOS not in comp.token_ids[:4]
    assert comp.finish_reason == FinishReason.STOP

    tok = 200
    forced_stop = _greedy(20, min_tokens=3, logit_bias={tok: 100.0}, stop_token_ids=[tok])
    comp = llm.generate([prompt], forced_stop)[0].outputs[0]
    assert len(comp.token_ids) == 4 and comp.token_ids[-1] == tok and tok not in comp.token_ids[:3]
    assert comp.stop_reason == tok


def test_max_tokens_finishes_with_length(make_llm, prompts):
    llm = make_llm(MODEL)
    for n in (1, 7):
        comp = llm.generate([prompts([9], seed=30)[0]], _greedy(n))[0].outputs[0]
        assert len(comp.token_ids) == n
        assert comp.finish_reason == FinishReason.LENGTH and comp.stop_reason is None


# ---- logprobs -------------------------------------------------------------------------------

def _hf_logprobs(hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at each output position: [len(tokens), V]."""
    z = hf.logits(MODEL, prompt + tokens[:-1])[len(prompt) - 1:]
    return torch.log_softmax(z.double(), dim=-1)


@pytest.mark.parametrize("params", [
    _greedy(12, logprobs=5),
    SamplingParams(temperature=1.2, seed=3, max_tokens=12, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=1.0, seed=4, max_tokens=8, ignore_eos=True, logprobs=0,
                   logit_bias={123: 100.0}),
], ids=["greedy_top5", "sampled_top3", "biased_top0"])
def test_logprobs_match_transformers(params, make_llm, hf, prompts):
    """Logprobs are the model's own log_softmax (before temperature, penalties and bias)."""
    llm = make_llm(MODEL)
    prompt = prompts([17], seed=31)[0]
    comp = llm.generate([prompt], params)[0].outputs[0]
    assert comp.logprobs is not None and len(comp.logprobs) == len(comp.token_ids)
    ref = _hf_logprobs(hf, prompt, comp.token_ids)
    for j, (tok, lp) in enumerate(zip(comp.token_ids, comp.logprobs)):
        assert lp.token_id == tok
        assert abs(lp.logprob - float(ref[j, tok])) <= LOGPROB_ATOL
        assert len(lp.top) == params.logprobs
        top_vals, top_ids = ref[j].topk(params.logprobs)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        for (_, v), rv in zip(lp.top, top_vals.tolist()):
            assert abs(v - rv) <= LOGPROB_ATOL
    assert llm.generate([prompt], _greedy(3))[0].outputs[0].logprobs is None


# ---- penalties and logit_bias -----------------------------------------------------------------

def test_repetition_penalty_matches_transformers(make_llm, hf, prompts):
    llm = make_llm(MODEL)
    prompt = prompts([20], seed=32)[0]
    comp = llm.generate([prompt], _greedy(20, repetition_penalty=1.8))[0].outputs[0]
    model = hf.model(MODEL)
    ids = torch.tensor([prompt])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20,
                         repetition_penalty=1.8, eos_token_id=model.config.vocab_size, pad_token_id=0)
    assert comp.token_ids == ref[0, len(prompt):].tolist()
    assert comp.token_ids != hf.greedy(MODEL, prompt, 20), "the penalty changed nothing: weak test"


@pytest.mark.parametrize("presence,frequency", [(1.5, 0.0), (0.0, 1.2), (0.8, 0.9)])
def test_presence_and_frequency_penalties(presence, frequency, make_llm, hf, prompts):
    """OpenAI semantics: z -= frequency * count + presence * [count > 0], over generated tokens."""
    llm = make_llm(MODEL)
    prompt = prompts([12], seed=33)[0]
    comp = llm.generate([prompt], _greedy(16, presence_penalty=presence,
                                          frequency_penalty=frequency))[0].outputs[0]

    def penalise(z: torch.Tensor, generated: list[int]) -> torch.Tensor:
        counts = torch.zeros_like(z)
        for t in generated:
            counts[t] += 1
        return z - frequency * counts - presence * (counts > 0).float()

    assert comp.token_ids == hf_greedy_processed(hf, prompt, 16, penalise)
    assert comp.token_ids != hf.greedy(MODEL, prompt, 16), "the penalty changed nothing: weak test"


def test_logit_bias_greedy_and_forced(make_llm, hf, prompts):
    llm = make_llm(MODEL)
    prompt = prompts([14], seed=34)[0]
    plain = hf.greedy(MODEL, prompt, 12)
    bias = {plain[0]: -100.0, plain[3]: -5.0, 77: 2.5, 150: 3.0}
    comp = llm.generate([prompt], _greedy(12, logit_bias=bias))[0].outputs[0]

    def add_bias(z: torch.Tensor, _: list[int]) -> torch.Tensor:
        for t, b in bias.items():
            z[t] += b
        return z

    assert comp.token_ids == hf_greedy_processed(hf, prompt, 12, add_bias)
    sampled = SamplingParams(temperature=1.5, seed=8, max_tokens=10, ignore_eos=True, logit_bias={42: 100.0})
    assert llm.generate([prompt], sampled)[0].outputs[0].token_ids == [42] * 10


# ---- abort ----------------------------------------------------------------------------------

def _free(llm) -> int:
    return llm.core.kv.pool.num_free


def test_abort_running_waiting_and_parent_of_n(make_llm, prompts, drive):
    llm = make_llm(MODEL, max_num_seqs=3, max_num_batched_tokens=16)
    core = llm.core
    ps = prompts([40, 9, 25, 30], seed=35)
    d = drive(core)
    d.add("long", ps[0], _greedy(30))                        # chunked: still in prefill below
    d.add("pair", ps[1], SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=30, ignore_eos=True))
    d.add("queued", ps[2], _greedy(30))
    d.add("keep", ps[3], _greedy(6))
    d.add("instant", ps[3], _greedy(6))
    assert [o.outputs[0].finish_reason for o in core.abort(["instant"])] == [FinishReason.ABORT]
    d.step()
    assert core.scheduler.requests["long"].num_computed_tokens < 40, "expected 'long' mid-prefill"
    assert "queued" in {r.request_id for r in core.scheduler.waiting}
    held = len(core.scheduler.requests["long"].block_ids)
    before = _free(llm)
    outs = core.abort(["long", "queued", "pair", "no-such-request"])
    assert sorted(o.request_id for o in outs) == ["long", "pair", "queued"]
    for o in outs:
        assert o.finished and all(c.finish_reason == FinishReason.ABORT for c in o.outputs)
    assert len(next(o for o in outs if o.request_id == "pair").outputs) == 2
    assert _free(llm) >= before + held
    run = d.until_done()
    assert run.final["keep"].outputs[0].finish_reason == FinishReason.LENGTH
    assert not core.scheduler.requests and _free(llm) == core.kv.num_blocks


def test_abort_a_preempted_request(make_llm, prompts, drive):
    llm = make_llm(MODEL, num_kv_blocks=6)
    core = llm.core
    d = drive(core)
    d.add_all(prompts([30, 30, 30], seed=36), _greedy(30))
    victim: str | None = None
    for _ in range(200):
        d.step()
        pre = [r for r in core.scheduler.waiting if r.times.num_preemptions > 0]
        if pre:
            victim = pre[0].request_id
            break
    assert victim is not None, "no request was preempted"
    [out] = core.abort([victim])
    assert out.outputs[0].finish_reason == FinishReason.ABORT
    d.until_done()


def test_abort_with_pending_drafts_frees_their_probabilities(make_llm, hf, prompts, drive):
    """With a draft model, stored draft probabilities are released by abort and by finishing."""
    llm = make_llm(MODEL, draft_model="qwen2", num_speculative_tokens=3)
    core = llm.core
    ps = prompts([12, 20, 7], seed=37)
    d = drive(core)
    d.add("greedy", ps[0], _greedy(10))
    d.add("sampled", ps[1], SamplingParams(temperature=1.0, seed=2, max_tokens=30, ignore_eos=True))
    d.add("other", ps[2], SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True))
    for _ in range(50):
        d.step()
        if core.scheduler.requests.get("sampled") is not None and \
                core.scheduler.requests["sampled"].draft_probs is not None:
            break
    assert core.draft_prob_bytes() > 0, "no draft probabilities were ever stored"
    core.abort(["sampled"])
    run = d.until_done()
    assert core.draft_prob_bytes() == 0
    assert run.final["greedy"].outputs[0].token_ids == hf.greedy(MODEL, ps[0], 10)


def test_the_leak_check_catches_a_request_left_behind(tiny_checkpoint):
    """The post-test check of ``make_llm`` is not vacuous."""
    from specserve.engine import LLM
    from tests.conftest import assert_engine_clean

    llm = LLM(model=str(tiny_checkpoint(MODEL)), device="cpu", dtype="float32")
    llm.core.add_request("left", [5, 6, 7, 8], _greedy(5))
    llm.core.step()
    with pytest.raises(AssertionError, match="left"):
        assert_engine_clean(llm.core)
    llm.core.abort(["left"])
    assert_engine_clean(llm.core)
