"""Load: 300 mixed requests at concurrency 64 against a KV pool small enough to preempt all the time.

Speculative decoding on (k=3, a partly-agreeing draft). Half the requests are greedy, half seeded
samples; each of 48 distinct configurations is sent about six times, streamed or not, through
/v1/completions or /v1/chat/completions. Every request must finish with a finish reason that
matches its tokens; every greedy and every seeded answer must equal the one-at-a-time answer of
its configuration; afterwards the KV pool is empty and no draft probability is held.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Optional

import httpx

from tests.reliability.clients import Outcome, run_request
from tests.reliability.conftest import start_server
from tests.server.live import metric, scrape

NUM_REQUESTS = 300
CONCURRENCY = 64
SEED = 20240
BASE_TEXTS = [
    "def add(a, b):", "The quick brown fox", "import os\nimport sys\n", "class Point:",
    "for i in range(10):", "Hello, world! Bonjour", "Grüße aus Köln, 東京", "if __name__ == '__main__':",
]


@dataclass(frozen=True)
class Config:
    """One distinct request; ``mode`` is 'greedy' or 'seeded'."""

    chat: bool
    prompt: str
    max_tokens: int
    n: int
    mode: str
    ignore_eos: bool
    stop: Optional[tuple[str, ...]]
    stop_token_ids: Optional[tuple[int, ...]]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None

    def body(self, stream: bool) -> dict:
        b: dict = {"model": "tiny", "n": self.n, "temperature": self.temperature, "top_p": self.top_p,
                   "top_k": self.top_k, "ignore_eos": self.ignore_eos, "return_token_ids": True,
                   "stream": stream}
        if self.seed is not None:
            b["seed"] = self.seed
        if self.stop:
            b["stop"] = list(self.stop)
        if self.stop_token_ids:
            b["stop_token_ids"] = list(self.stop_token_ids)
        if self.chat:
            b["messages"] = [{"role": "user", "content": self.prompt}]
            b["max_completion_tokens"] = self.max_tokens
        else:
            b["prompt"] = self.prompt
            b["max_tokens"] = self.max_tokens
        return b

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"


def make_configs(rng: random.Random) -> list[Config]:
    configs = []
    for i in range(48):
        mode = "greedy" if i % 2 == 0 else "seeded"
        text = BASE_TEXTS[i % len(BASE_TEXTS)]
        prompt = " ".join([text] * rng.choice([1, 1, 2, 3, 4]))  # ~5 to ~70 tokens
        extra = {} if mode == "greedy" else dict(
            temperature=rng.choice([0.7, 1.0, 1.3]), top_p=rng.choice([1.0, 0.9]),
            top_k=rng.choice([0, 20]), seed=rng.randrange(2**31))
        configs.append(Config(chat=i % 3 == 0, prompt=prompt, max_tokens=rng.choice([1, 8, 16, 32, 48, 64]),
                              n=2 if i % 7 == 0 else 1, mode=mode, ignore_eos=rng.random() < 0.5,
                              stop=("e", "t") if i % 5 == 0 else None,
                              stop_token_ids=tuple(range(100, 140)) if i % 5 == 1 else None, **extra))
    return configs


def finish_problem(cfg: Config, out: Outcome, eos_id: int) -> Optional[str]:
    """Why ``out`` is not a correct, complete answer to ``cfg`` (None if it is)."""
    if out.status != 200 or out.error is not None:
        return f"status {out.status}, error {out.error}"
    if sorted(out.choices) != list(range(cfg.n)):
        return f"choices {sorted(out.choices)} for n={cfg.n}"
    for i, c in out.choices.items():
        if c.finish_reason == "length":
            if len(c.token_ids) != cfg.max_tokens:
                return f"choice {i}: 'length' after {len(c.token_ids)} of {cfg.max_tokens} tokens"
        elif c.finish_reason == "stop":
            by_eos = not cfg.ignore_eos and c.token_ids and c.token_ids[-1] == eos_id and c.stop_reason is None
            by_str = cfg.stop is not None and c.stop_reason in cfg.stop and not any(s in c.text for s in cfg.stop)
            by_id = (cfg.stop_token_ids is not None and c.stop_reason in cfg.stop_token_ids
                     and c.token_ids[-1] == c.stop_reason)
            if not (by_eos or by_str or by_id) or len(c.token_ids) > cfg.max_tokens:
                return f"choice {i}: 'stop' without a stop condition ({c.stop_reason!r}, {c.token_ids[-3:]})"
        else:
            return f"choice {i}: finish_reason {c.finish_reason!r}"
    return None


async def _run_all(url: str, headers: dict, jobs: list[tuple[Config, bool]]) -> list[Outcome]:
    sem = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:
        async def one(cfg: Config, stream: bool) -> Outcome:
            async with sem:
                return await run_request(client, cfg.path, cfg.body(stream))

        return await asyncio.gather(*(one(c, s) for c, s in jobs))


async def _run_sequential(url: str, headers: dict, configs: list[Config]) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        return [await run_request(client, c.path, c.body(False)) for c in configs]


def test_load_with_preemption_is_exact_and_leaves_nothing(pair, eos_id, ledger) -> None:
    rng = random.Random(SEED)
    configs = make_configs(rng)
    jobs = [(configs[i % len(configs)], rng.random() < 0.5) for i in range(NUM_REQUESTS)]
    rng.shuffle(jobs)
    # 20 blocks x 8 tokens = 160 slots for up to 64 running sequences of up to ~150 slots each
    # (max_model_len is lowered to the 157 that one request can use: --auto-fit-max-model-len)
    with start_server(pair, "--block-size", "8", "--num-kv-blocks", "20", "--max-num-seqs", "64",
                      "--max-waiting-requests", "1024", "--auto-fit-max-model-len") as srv:
        before = scrape(srv.url)
        outcomes = asyncio.run(_run_all(srv.url, srv.headers, jobs))
        after = scrape(srv.url)
        state = srv.wait_idle()
        reference = dict(zip(configs, asyncio.run(_run_sequential(srv.url, srv.headers, configs))))

    problems = [f"{cfg}: {why}" for (cfg, stream), out in zip(jobs, outcomes)
                if (why := finish_problem(cfg, out, eos_id) or (stream and not out.done_marker and "no [DONE]"))]
    reasons = [c.finish_reason for o in outcomes for c in o.choices.values()]
    mismatched = [cfg for (cfg, _), out in zip(jobs, outcomes) if out.signature() != reference[cfg].signature()]
    def grew(name: str) -> float:
        return metric(after, name) - metric(before, name)

    preemptions = grew("specserve:num_preemptions_total")
    drafts = grew("specserve:spec_decode_num_drafts_total")
    accepted = grew("specserve:spec_decode_num_accepted_tokens_total")
    ledger.add("load", "requests", len(jobs))
    ledger.add("load", "concurrency", CONCURRENCY)
    ledger.add("load", "streamed", sum(s for _, s in jobs))
    ledger.add("load", "greedy / seeded", f"{sum(c.mode == 'greedy' for c, _ in jobs)} / "
                                         f"{sum(c.mode == 'seeded' for c, _ in jobs)}")
    ledger.add("load", "completed correctly", len(jobs) - len(problems))
    ledger.add("load", "finish reasons", f"length {reasons.count('length')} / stop {reasons.count('stop')}")
    ledger.add("load", "equal to one-at-a-time", len(jobs) - len(mismatched))
    ledger.add("load", "preemptions", int(preemptions))
    ledger.add("load", "KV blocks free after", f"{state['num_free_blocks']}/{state['num_total_blocks']}")
    ledger.add("load", "draft prob bytes after", state["draft_prob_bytes"])
    ledger.add("load", "acceptance length", round(1 + accepted / max(drafts, 1), 2))
    ledger.add("load", "max latency s", round(max(o.seconds for o in outcomes), 2))

    assert not problems, f"{len(problems)} requests did not finish correctly:\n" + "\n".join(problems[:10])
    assert not [c for c in configs if finish_problem(c, reference[c], eos_id)]
    assert not mismatched, (f"{len(mismatched)} answers differ from the one-at-a-time answer, e.g. "
                            f"{mismatched[0]}")
    assert preemptions >= 50, f"only {preemptions} preemptions: the pool is not small enough to test them"
    assert state["num_unfinished_requests"] == 0 and state["num_streams"] == 0, state
    assert state["num_free_blocks"] == state["num_total_blocks"], state
    assert state["draft_prob_bytes"] == 0, state
    assert drafts > 0 and 0 < accepted < drafts * 3, "speculative decoding did not run with partial acceptance"
