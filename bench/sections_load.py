"""Sections 4-6: end-to-end speed-up vs the formula, the HF peer, load through the HTTP server."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

from specserve.bench.e2e import E2ESettings, compare_pair
from specserve.bench.engines import random_prompts
from specserve.bench.peer import compare_with_hf
from specserve.bench.serve_load import ServerProcess, run_level
from specserve.bench.context import BenchContext
from specserve.bench.report import Column, Section, at_least, within

E2E_TOLERANCE = 0.10
E2E_GOAL = f"within {100 * E2E_TOLERANCE:.0f}% of E/(kc+1)"
PEER_GOAL = 3.0
REPO_ROOT = Path(__file__).resolve().parents[1]


def e2e(ctx: BenchContext) -> Section:
    o = ctx.opts
    settings = E2ESettings(tuple(o.batch_sizes), o.prompt_len, o.output_len, o.k, o.warmup,
                           o.repeats, o.seed)
    rows: list[dict] = []
    data: dict = {"settings": settings.__dict__, "pairs": {}, "errors": {}}
    goal = E2E_GOAL
    dirs, why = ctx.pair_dirs()
    runs = []
    if dirs is None:
        rows.append({"pair": "demo pair", "label": "demo pair", "status": f"skipped: {why}", "goal": goal})
    else:
        label = "demo" if why == "demo pair" else Path(dirs[0]).name
        runs.append((f"{label} ({why})", lambda: (ctx.pair_core("plain"), ctx.pair_core("pair")), {}))
    tgt, dft = (Path(p).name for p in ctx.dummy_dirs())
    plain_runs: dict = {}        # both dummy pairs share the plain 8B-like engine and its runs
    for flavour, label in (("self", f"{tgt} self-draft"), ("pair", f"{tgt} + {dft} (dummy)")):
        runs.append((label, lambda f=flavour: (ctx.dummy_core("plain"), ctx.dummy_core(f)), plain_runs))
    for label, cores, base_runs in runs:
        ctx.log(f"e2e: {label}")
        try:
            base, spec = cores()
            res = compare_pair(base, spec, settings, ctx.log, label, base_runs)
        except Exception as e:   # noqa: BLE001 - one pair failing must not lose the others
            ctx.log(f"e2e: {label} FAILED: {type(e).__name__}: {e}")
            data["errors"][label] = f"{type(e).__name__}: {e}"
            rows.append({"pair": label, "label": label, "goal": goal, "status": f"failed: {e}"})
            continue
        rows += _e2e_rows(label, res)
        data["pairs"][label] = res
    cols = [Column("pair", "Pair", "str"), Column("batch", "Batch", "int"),
            Column("no_spec_tok_per_s", "tok/s no spec", "tps"), Column("spec_tok_per_s", "tok/s spec", "tps"),
            Column("acceptance_length", "E (accept len)", "num"), Column("c", "c", "num"),
            Column("v", "v", "num"), Column("plain_step_over_forward", "step/fwd", "num"),
            Column("measured_speedup", "Speed-up", "x"),
            Column("predicted_speedup", "E/(kc+1)", "x"),
            Column("predicted_speedup_with_verify_cost", "E/(kc+v)", "x"),
            Column("c_step", "c'", "num"), Column("predicted_speedup_from_steps", "E/(kc'+1)", "x"),
            Column("e_steps", "E_run", "num"), Column("predicted_speedup_e_steps", "E_run/(kc+1)", "x"),
            Column("identical_greedy_outputs", "Same greedy", "str"),
            Column("goal", "Goal", "str"), Column("status", "Status", "str")]
    return Section("e2e", f"End to end with and without speculation (k = {o.k}, greedy)", cols, rows,
                   notes=[f"Prompts of {o.prompt_len} random tokens, {o.output_len} output tokens "
                          "each (ignore_eos). tokens/s counts the decode phase (from the step in which "
                          "every request had its first token); prefill is excluded.",
                          "c = draft forward / target forward (1 token per request), v = target "
                          "forward over k+1 tokens / over 1, both at that batch size on runner._forward; "
                          "step/fwd = a plain EngineCore step / its target forward (what the formula "
                          "leaves out: scheduling, sampling, detokenization, host reads).",
                          "Self-draft (draft = target, shared weights, own KV): acceptance ~1 is the "
                          "upper bound; with c ~ 1 the formula predicts ~1x: it checks the machinery.",
                          "The dummy 0.6B-like draft has unrelated random weights (acceptance ~0): "
                          "the lower bound, where speculation costs k c + v - 1 extra.",
                          "Goal: measured speed-up within 10% of E/(kc+1); E/(kc+v) shows what the "
                          "verification forward itself costs.",
                          "c' = the draft program (catch-up, k passes, sampling: what a step runs, "
                          "bench/verify.py) per draft token / a plain EngineCore step, both at that "
                          "batch size. E/(kc'+1) counts the draft at its real cost but takes the target "
                          "side of a speculative step to cost one plain step; where it over-predicts, "
                          "the target side of a speculative step (verification, the rejection sampler, "
                          "E tokens of bookkeeping) costs more than a plain step.",
                          "E_run = plain decode steps / speculative decode steps of the same "
                          "workload: the plain steps one speculative step replaced. It falls below E "
                          "where k shrinks near max_tokens (the fixed output length makes every "
                          "request reach it together) and where requests accept differently and the "
                          "batch waits for the slowest; E_run/(kc+1) is the formula with it.",
                          "Same greedy: requests whose speculative output equals the plain output "
                          "token for token (exact in fp32; in bf16 near-ties may flip a token)."],
                   data=data, error="; ".join(f"{k}: {v}" for k, v in data["errors"].items()) or None)


def _e2e_rows(label: str, results: list[dict]) -> list[dict]:
    rows = []
    for r in results:
        row = {key: v for key, v in r.items() if not key.endswith("_run")}
        row["pair"] = label
        row["label"] = f"{label}, batch {r['batch']}"
        row["goal"] = E2E_GOAL
        row["status"] = within(r["measured_speedup"], r["predicted_speedup"], E2E_TOLERANCE)
        rows.append(row)
    return rows


def peer(ctx: BenchContext) -> Section:
    o = ctx.opts
    cols = [Column("label", "Quantity", "str"), Column("value", "Value", "row"),
            Column("goal", "Goal", "str"), Column("status", "Status", "str")]
    dirs, why = ctx.pair_dirs()
    title = f"Peer: HF transformers assisted generation at batch 1 (k = {o.k})"
    if dirs is None:
        return Section("peer", title, cols, skipped=why)
    ctx.log(f"peer: ours vs transformers generate(assistant_model=...) on the {why}")
    r = compare_with_hf(ctx.pair_core("pair"), dirs[0], dirs[1], o.k, o.prompt_len, o.output_len,
                        o.peer_repeats, o.seed)
    ctx.log(f"peer: ours {r['ours_tok_per_s']:.1f} tok/s, transformers {r['hf_tok_per_s']:.1f} tok/s "
            f"({r['ratio']:.2f}x)")
    rows = [{"label": "specserve tokens/s (speculative, batch 1)", "value": r["ours_tok_per_s"], "kind": "tps"},
            {"label": "transformers tokens/s (assistant_model, constant k, no confidence stop)",
             "value": r["hf_tok_per_s"], "kind": "tps"},
            {"label": "ratio", "value": r["ratio"], "kind": "x", "goal": f">= {PEER_GOAL:.0f}x",
             "status": at_least(r["ratio"], PEER_GOAL)},
            {"label": "identical greedy tokens", "value": r["identical_tokens"], "kind": "bool"},
            {"label": "common prefix (tokens)", "value": r["common_prefix"], "kind": "int"}]
    import transformers

    return Section("peer", title, cols, rows,
                   notes=[f"{why}: {Path(dirs[0]).name} + {Path(dirs[1]).name}, {r['dtype']}; prompt "
                          f"{o.prompt_len} tokens, {o.output_len} new tokens, greedy, EOS unreachable; "
                          f"end-to-end time (prefill included), median of {o.peer_repeats} after a warm-up.",
                          f"transformers {transformers.__version__}: num_assistant_tokens={o.k}, "
                          "num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0."],
                   data=r)


def serve(ctx: BenchContext) -> Section:
    o = ctx.opts
    title = "Throughput under load through the HTTP server"
    cols = [Column("concurrency", "Concurrency", "int")] + \
        ([Column("client", "Client", "str")] if len(o.load_clients) > 1 else []) + \
        [Column("num_requests", "Requests", "int"),
            Column("failed", "Failed", "int"), Column("output_tok_per_s", "Output tok/s", "tps"),
            Column("ttft_p50", "TTFT p50", "time"), Column("ttft_p99", "TTFT p99", "time"),
            Column("itl_p50", "ITL p50", "time"), Column("itl_p99", "ITL p99", "time"),
            Column("tpot_p50", "TPOT p50", "time"), Column("tpot_p99", "TPOT p99", "time"),
            Column("e2e_p50", "E2E p50", "time"), Column("e2e_p99", "E2E p99", "time"),
            Column("acceptance_rate", "Accept rate", "pct"), Column("acceptance_length", "Accept len", "num"),
            Column("per_position", "Per position", "str")]
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        return Section("serve", title, cols, skipped=f"{', '.join(missing)} not installed here")
    ctx.release_models()       # the server process needs the device memory
    argv, model_desc = _serve_argv(ctx)
    ctx.log(f"serve: starting specserve serve ({model_desc})")
    rows, levels = [], []
    env = {"OMP_NUM_THREADS": str(o.cpu_threads)} if o.cpu_threads else None
    with ServerProcess(argv, ctx.out / "serve.log", REPO_ROOT, env, o.serve_log_level) as server:
        model = server.wait_ready(o.serve_timeout)
        vocab = _vocab(argv)
        warm = random_prompts(2, o.prompt_len, vocab, o.seed + 77)
        run_level(server.url, model, warm, o.serve_output_len, 2, stream=o.serve_stream)
        for c, client in ((c, client) for c in o.serve_concurrency for client in o.load_clients):
            prompts = random_prompts(o.requests_for(c), o.prompt_len, vocab, o.seed + 1000 + c)
            lvl = run_level(server.url, model, prompts, o.serve_output_len, c, stream=o.serve_stream,
                            client_kind=client)
            levels.append(lvl)
            rows.append(_serve_row(lvl))
            ctx.log(f"serve: concurrency {c} ({client}): {lvl['output_tok_per_s']:.1f} tok/s, TTFT p50 "
                    f"{_ms(lvl['ttft_ms']['p50'])}, ITL p50 {_ms(lvl['itl_ms']['p50'])}, "
                    f"accept len {lvl['spec_decode']['acceptance_length']}{_tcp_note(lvl['tcp'])}"
                    f"{_slow_note(lvl['slow_requests'])}")
        command = " ".join(server.command)
    return Section("serve", title, cols, rows,
                   notes=[f"{model_desc}; prompts of {o.prompt_len} random token ids, {o.serve_output_len} "
                          "output tokens, greedy, ignore_eos, "
                          + ("streaming /v1/completions with return_token_ids (ITL = gap between SSE "
                             "chunks; one chunk may carry several accepted tokens)." if o.serve_stream else
                             "/v1/completions answered in one JSON body (--serve-no-stream: no TTFT, "
                             "ITL or TPOT; E2E is send to the whole body)."),
                          "Acceptance from /metrics before and after each level: rate = accepted / "
                          "draft tokens, length = 1 + accepted / drafts, per position = accepted_per_pos / drafts.",
                          f"Load client: {' and '.join(o.load_clients)} (httpx: its connection pool; "
                          "raw: one keep-alive connection per concurrent worker over asyncio streams), "
                          "in a process of its own; each level lists the requests over 1 s as the "
                          "client, the server's app (http_request_duration_seconds) and its engine "
                          "(e2e_request_latency_seconds) timed them (`slow_requests` in bench.json).",
                          f"Server command: `{command}` (log: serve.log)."],
                   data={"levels": levels, "server_command": command})


def _tcp_note(tcp: Optional[dict]) -> str:
    """The level's TCP trouble for its log line: new connections, and any SYN resent, accept
    queue overflow or timeout (empty off Linux)."""
    if not tcp:
        return ""
    trouble = [f"{k} {tcp[k]}" for k in ("ListenOverflows", "ListenDrops", "TCPSynRetrans", "TCPTimeouts")
               if tcp.get(k)]
    return f"; TCP: {tcp.get('PassiveOpens', 0)} connections accepted" + "".join(f", {t}" for t in trouble)


def _slow_note(slow: dict) -> str:
    """Requests over the slow bound as the client, the server's app and its engine timed them."""
    if not slow["client"] and not slow["server"]:
        return ""
    server = "n/a" if slow["server"] is None else f"{slow['server']:g}"
    http = "n/a" if slow.get("http") is None else f"{slow['http']:g}"
    return (f"; over {slow['over_s']:g} s: {slow['client']} by the client, {http} in the server's "
            f"app, {server} in its engine")


def _serve_argv(ctx: BenchContext) -> tuple[list[str], str]:
    o = ctx.opts
    dirs, why = ctx.pair_dirs()
    extra: list[str] = []
    if dirs is None:
        dirs = ctx.dummy_dirs()
        extra = ["--load-format", "dummy"]
        desc = f"dummy {Path(dirs[0]).name} + {Path(dirs[1]).name} ({why})"
    else:
        desc = f"{why}: {Path(dirs[0]).name} + {Path(dirs[1]).name}"
    c = max(o.serve_concurrency)
    per_seq = -(-(o.prompt_len + o.serve_output_len + 2 * (o.k + 1)) // 16) + 1
    # fixed k, like the e2e section: these rows measure the pair at k; the adaptive section
    # measures adaptive k against every fixed k
    argv = ["--model", dirs[0], "--draft-model", dirs[1], "--num-speculative-tokens", str(o.k),
            "--speculative-k", "fixed", "--device", str(ctx.device), "--dtype", ctx.dtype, "--kernel-backend", o.kernel_backend,
            "--num-kv-blocks", str(c * per_seq + 8), "--max-num-seqs", str(c),
            "--max-model-len", str(min(o.max_model_len, _max_positions(dirs))),
            "--seed", str(o.seed), *extra]
    if o.enforce_eager:
        argv.append("--enforce-eager")
    argv += ["--ragged-graph-tokens", str(o.ragged_graph_tokens)]
    return argv, desc


def _max_positions(dirs: tuple[str, str]) -> int:
    from specserve.engine.models.spec import read_model_spec

    return min(read_model_spec(d).max_position_embeddings for d in dirs)


def _vocab(argv: list[str]) -> int:
    from specserve.engine.models.spec import read_model_spec

    return read_model_spec(argv[argv.index("--model") + 1]).vocab_size


def _serve_row(lvl: dict) -> dict:
    sd = lvl["spec_decode"]
    row = {"concurrency": lvl["concurrency"], "client": lvl["client"], "num_requests": lvl["num_requests"],
           "failed": lvl["failed"], "output_tok_per_s": lvl["output_tok_per_s"],
           "acceptance_rate": sd["acceptance_rate"], "acceptance_length": sd["acceptance_length"],
           "per_position": " / ".join(f"{p:.2f}" for p in sd["per_position_acceptance"]) or None}
    for metric in ("ttft", "itl", "tpot", "e2e"):
        for q in ("p50", "p99"):
            v = lvl[f"{metric}_ms"][q]
            row[f"{metric}_{q}"] = None if v is None else v / 1e3
    return row


def _ms(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"
