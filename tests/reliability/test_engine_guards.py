"""Engine-side guards the reliability runs found missing (reported in /work/prompts/engine_bugs.md).

The server refuses these inputs itself where it can; these tests pin the engine's own
behaviour so that ``engine.LLM`` users and the queue limit are protected too.
"""

from __future__ import annotations

import asyncio

import httpx

from specserve.engine.types import ParamError, SamplingParams
from tests.reliability.clients import run_request
from tests.reliability.conftest import MAX_RUNNING, MAX_WAITING


def test_sampling_params_refuse_top_k_beyond_int32() -> None:
    try:
        SamplingParams(top_k=2**40)
    except ParamError as e:
        assert e.param == "top_k"
        return
    raise AssertionError("top_k=2**40 was accepted")


def test_queue_limit_holds_while_an_n_request_runs(queue_srv) -> None:
    """One request with n=4 fills the 4 running slots; then only 8 more may wait, the rest get 503."""
    long = {"model": "tiny", "prompt": "import os", "max_tokens": 200, "ignore_eos": True}

    async def scenario(srv) -> list[int]:
        async with httpx.AsyncClient(base_url=srv.url, headers=srv.headers, timeout=60) as c:
            async with c.stream("POST", "/v1/completions", json={**long, "n": 4, "stream": True}) as first:
                lines = first.aiter_lines()
                while not (await lines.__anext__()).startswith("data: "):
                    pass  # running now: 4 sequences, 1 stream
                outs = await asyncio.gather(*(run_request(c, "/v1/completions", long)
                                              for _ in range(MAX_WAITING + 3)))
                return [o.status for o in outs]

    assert MAX_RUNNING == 4
    statuses = asyncio.run(scenario(queue_srv))
    assert queue_srv.wait_idle()["num_unfinished_requests"] == 0
    assert statuses.count(503) >= 3, statuses
