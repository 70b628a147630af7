"""``specserve bench --quick --device cpu``: the whole benchmark at toy size, checked for sanity.

One real run (a subprocess, exactly as a user types it) over a tiny trained-format pair built by
the tests (Qwen3 target + a lightly perturbed copy as draft) and the benchmark's own tiny dummy
shapes. The checks are about the numbers being the right numbers, not about speed: greedy
speculative output equals plain output in fp32 (and equals transformers' assisted generation),
self-draft accepts every draft, the formula columns are the stated formulas of the measured
columns, the client-side token count equals the /metrics delta, the files are complete.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

REPO = Path(__file__).resolve().parents[2]
K = 4
SERVE_CONCURRENCY = (1, 4)
SERVE_OUTPUT = 8


def _tiny_pair(root: Path) -> tuple[Path, Path]:
    """A tiny qwen3 target and a draft that is its slightly perturbed copy (high acceptance)."""
    target = make_tiny_checkpoint(root / "target", arch="qwen3", seed=3)
    return target, make_perturbed_copy(target, root / "draft", noise=0.002, seed=4)


def _bench_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("bench")
    target, draft = _tiny_pair(root)
    out = root / "out"
    cmd = [sys.executable, "-m", "specserve.server.cli", "bench", "--out", str(out), "--quick", "--device", "cpu",
           "--pair-target", str(target), "--pair-draft", str(draft), "--k", str(K),
           "--serve-concurrency", ",".join(map(str, SERVE_CONCURRENCY)),
           "--serve-output-len", str(SERVE_OUTPUT), "--serve-clients", "raw,httpx"]
    env = _bench_env()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    doc = json.loads((out / "bench.json").read_text())
    return {"out": out, "doc": doc, "md": (out / "bench.md").read_text(), "stderr": proc.stderr,
            "seconds": seconds}


def _section(run: dict, name: str) -> dict:
    s = run["doc"]["sections"][name]
    assert s["error"] is None, f"section {name} failed: {s['error']}\n{s['data'].get('traceback')}"
    return s


def test_environment_and_progress(bench_run):
    env = bench_run["doc"]["env"]
    for key in ("date", "device", "torch", "transformers", "command", "python"):
        assert env[key], key
    assert "bench --out" in env["command"] and "--quick" in env["command"]
    assert env["device"].startswith("CPU")
    assert bench_run["doc"]["settings"]["execution_mode"] == "eager (CPU)"
    assert bench_run["doc"]["failed_sections"] == []
    # progress lines for every section, as it goes
    for name in ("roofline", "verify", "sampler", "e2e", "peer", "serve"):
        assert f"== section {name} ==" in bench_run["stderr"]


def test_roofline_numbers_are_consistent(bench_run):
    d = _section(bench_run, "roofline")["data"]
    bw = d["bandwidth"]["bytes_per_s"]
    assert bw > 1e8, "a CPU copies more than 100 MB/s"
    assert d["roofline_tok_per_s"] == pytest.approx(bw / d["bytes_per_decode_step"], rel=1e-9)
    assert d["fraction_of_roofline"] == pytest.approx(d["measured_tok_per_s"] / d["roofline_tok_per_s"],
                                                      rel=1e-9)
    # the tiny target: 4 layers, hidden 256, untied 4096-word vocabulary, fp32
    assert d["parameter_bytes"] == 4 * d["num_parameters"]
    embedding = 4096 * 256 * 4
    assert d["bytes_per_decode_step"] == d["parameter_bytes"] - embedding + 256 * 4
    assert d["decode"]["steps"] == 8 and d["measured_tok_per_s"] > 0


def test_roofline_runs_the_compiled_peer_at_both_shapes(bench_run):
    s = _section(bench_run, "roofline")
    shapes = s["data"]["shapes"]
    assert list(shapes) == ["tiny-target", "tiny-llama"]      # the dummy target, then Llama-like
    for name, r in shapes.items():
        peer = r["peer"]
        assert "error" not in peer, peer
        assert peer["steps"] == 8 and peer["tok_per_s"] > 0
        assert peer["compile_mode"] in ("default", "eager")   # CPU: no CUDA graphs
        assert peer["compile_mode"] == "default" or peer["compile_note"], "an eager peer says why"
        assert peer["ours_over_peer"] == pytest.approx(r["measured_tok_per_s"] / peer["tok_per_s"])
        assert peer["fraction_of_roofline"] == pytest.approx(peer["tok_per_s"] / r["roofline_tok_per_s"])
        rows = [row for row in s["rows"] if row["model"] == name]
        peer_rows = [row for row in rows if row["label"].startswith("peer: compiled PyTorch decode tokens/s")]
        assert len(peer_rows) == 1 and peer_rows[0]["value"] == peer["tok_per_s"] > 0
        ratio = next(row for row in rows if row["label"] == f"ours / peer ({name})")
        assert ratio["goal"] == ">= 1.05x" and ratio["value"] == peer["ours_over_peer"]
        assert ratio["status"] == ("met" if ratio["value"] >= 1.05 else ratio["status"])
        assert ratio["status"] == "met" or ratio["status"].startswith("missed: ")
    # the Llama-like target: untied, no q/k norms (its own parameter count)
    llama = shapes["tiny-llama"]
    assert llama["num_parameters"] == 2 * (256 * (256 + 2 * 128) + 256 * 256 + 3 * 256 * 512 + 2 * 256) \
        + 2 * 4096 * 256 + 256
    assert "== section roofline ==" in bench_run["stderr"] and "compiled peer" in bench_run["stderr"]


def test_verify_rows_and_goal(bench_run):
    s = _section(bench_run, "verify")
    ks = [r["k"] for r in s["data"]["target"]["verify"]]
    assert ks == [2, 4, 8]
    goal_rows = [r for r in s["rows"] if r.get("goal")]
    assert len(goal_rows) == 3        # verify at k = 4; one draft forward and the draft program vs the roofline
    for r in goal_rows:
        assert r["status"] == "met" if r["ratio"] <= float(r["goal"].split()[1].rstrip("x")) \
            else r["status"].startswith("missed: ")
    draft = s["data"]["draft"]
    assert draft["ratio_to_roofline"] == pytest.approx(
        draft["draft_step_seconds"] / draft["roofline_step_seconds"], rel=1e-9)
    assert draft["bytes_per_decode_step"] == draft["parameter_bytes"]   # tied draft: LM head = embedding
    program = s["data"]["draft_program"]
    assert program["per_draft_seconds"] == pytest.approx(program["program_seconds"] / program["k"])
    assert program["roofline_step_seconds"] == draft["roofline_step_seconds"]


def test_e2e_exactness_acceptance_and_formula(bench_run):
    s = _section(bench_run, "e2e")
    pairs = s["data"]["pairs"]
    assert len(pairs) == 3, list(pairs)           # the given pair, self-draft, dummy pair
    for label, rows in pairs.items():
        assert [r["batch"] for r in rows] == [1, 4]
        for r in rows:
            b = r["batch"]
            # greedy fp32: speculation changes nothing in the output
            assert r["identical_greedy_outputs"] == f"{b}/{b}", (label, b)
            assert r["measured_speedup"] == pytest.approx(r["spec_tok_per_s"] / r["no_spec_tok_per_s"])
            e, c = r["acceptance_length"], r["c"]
            assert 1.0 <= e <= K + 1
            assert r["predicted_speedup"] == pytest.approx(e / (K * c + 1))
            assert r["predicted_speedup_with_verify_cost"] == pytest.approx(e / (K * c + r["v"]))
            # diagnostics: c' from the draft program and a plain engine step; E_run from step counts
            assert r["c_step"] == pytest.approx(r["draft_program_s"] / K / r["plain_step_s"])
            assert r["predicted_speedup_from_steps"] == pytest.approx(e / (K * r["c_step"] + 1))
            e_run = r["no_spec_run"]["decode_steps"] / run_steps if (run_steps := r["spec_run"]["decode_steps"]) else None
            assert r["e_steps"] == pytest.approx(e_run)
            assert r["predicted_speedup_e_steps"] == pytest.approx(e_run / (K * c + 1))
            run = r["spec_run"]
            assert run["total_tokens"] == b * 16              # --quick output_len, ignore_eos
            assert r["no_spec_run"]["spec_decode"]["num_drafts"] == 0
    self_rows = next(rows for label, rows in pairs.items() if "self-draft" in label)
    for r in self_rows:
        # the draft is the target itself: every draft is accepted (fp32, greedy)
        assert r["acceptance_length"] == pytest.approx(K + 1, abs=0.3)
    # the table's diagnostic columns have values in the rows (row keys are filtered from the data)
    for row in (r for r in s["rows"] if "batch" in r):
        assert all(row.get(k) is not None for k in
                   ("c_step", "predicted_speedup_from_steps", "e_steps", "predicted_speedup_e_steps")), row


def test_peer_matches_transformers(bench_run):
    d = _section(bench_run, "peer")["data"]
    assert d["identical_tokens"], "greedy assisted generation must produce our tokens (fp32)"
    assert d["ratio"] == pytest.approx(d["ours_tok_per_s"] / d["hf_tok_per_s"])
    assert d["ours_tok_per_s"] > 0 and d["hf_tok_per_s"] > 0


def test_serve_levels_add_up(bench_run):
    s = _section(bench_run, "serve")
    levels = s["data"]["levels"]
    # streams through both load clients in turn: the raw one (the default) and httpx
    assert [(lvl["concurrency"], lvl["client"]) for lvl in levels] == \
        [(c, client) for c in SERVE_CONCURRENCY for client in ("raw", "httpx")]
    for lvl in levels:
        n = lvl["num_requests"]
        assert lvl["failed"] == 0 and lvl["completed"] == n, lvl["errors"]
        assert lvl["output_tokens"] == n * SERVE_OUTPUT
        assert lvl["usage_mismatches"] == 0
        sd = lvl["spec_decode"]
        # what the client counted is what /metrics counted between the two scrapes
        assert sd["generation_tokens"] == lvl["output_tokens"]
        assert 1.0 <= sd["acceptance_length"] <= K + 1
        per_pos = sd["per_position_acceptance"]
        assert len(per_pos) == K and all(a >= b for a, b in zip(per_pos, per_pos[1:]))
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            p50, p90, p99 = (lvl[metric][q] for q in ("p50", "p90", "p99"))
            assert 0 < p50 <= p90 <= p99, (metric, lvl[metric])
        assert lvl["ttft_ms"]["p50"] <= lvl["e2e_ms"]["p50"]
        # each request's start and end, within the level; the host's TCP counters over it (the
        # client opened at least one connection per concurrent request, the server accepted them)
        slow = lvl["slow_requests"]   # the server's e2e histogram saw every request finish
        assert slow["server_finished"] == n and 0 <= slow["server"] <= slow["http"] <= slow["client"] <= n
        assert len(lvl["timeline"]) == n and all(0 <= a < b <= lvl["duration_s"] + 1e-3 for a, b in lvl["timeline"])
        if sys.platform.startswith("linux"):
            assert lvl["tcp"]["PassiveOpens"] >= lvl["concurrency"] and lvl["tcp"]["ActiveOpens"] >= lvl["concurrency"]
    assert (bench_run["out"] / "serve.log").exists()


def test_serve_levels_without_streams(tmp_path):
    """--serve-no-stream: every request answered in one JSON body by a real server; the client's
    tokens are the usage blocks' and /metrics' counts, and the latencies a body cannot time
    (TTFT, ITL, TPOT) are not reported; --serve-log-level info reaches the server's log."""
    root = tmp_path
    target, draft = _tiny_pair(root)
    out = root / "out"
    cmd = [sys.executable, "-m", "specserve.bench.cli", "--out", str(out), "--quick", "--device", "cpu",
           "--sections", "serve", "--pair-target", str(target), "--pair-draft", str(draft), "--k", str(K),
           "--serve-concurrency", ",".join(map(str, SERVE_CONCURRENCY)),
           "--serve-output-len", str(SERVE_OUTPUT), "--serve-no-stream", "--serve-log-level", "info",
           "--serve-clients", "httpx,raw", "--no-plots"]
    env = _bench_env()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    s = _section({"doc": json.loads((out / "bench.json").read_text())}, "serve")
    levels = s["data"]["levels"]
    # --serve-clients httpx,raw: every level with each client in turn, against the same server
    assert [(lvl["concurrency"], lvl["client"]) for lvl in levels] == \
        [(c, client) for c in SERVE_CONCURRENCY for client in ("httpx", "raw")]
    assert [r["client"] for r in s["rows"]] == [lvl["client"] for lvl in levels]
    for lvl in levels:
        n = lvl["num_requests"]
        assert lvl["slow_requests"]["server_finished"] == n
        assert not lvl["stream"] and lvl["failed"] == 0 and lvl["completed"] == n, lvl["errors"]
        assert lvl["output_tokens"] == n * SERVE_OUTPUT == lvl["spec_decode"]["generation_tokens"]
        assert lvl["usage_mismatches"] == 0
        assert all(lvl[m]["p50"] is None for m in ("ttft_ms", "itl_ms", "tpot_ms"))
        assert 0 < lvl["e2e_ms"]["p50"] <= lvl["e2e_ms"]["p99"]
    assert "one JSON body" in (out / "bench.md").read_text()
    assert "INFO specserve.engine" in (out / "serve.log").read_text()   # --serve-log-level info


def test_sampler_section(bench_run):
    s = bench_run["doc"]["sections"]["sampler"]
    if not (REPO / "bench" / "rejection_sampler.py").exists():
        assert s["skipped"] and "rejection_sampler.py" in s["skipped"]
        return
    assert s["error"] is None, s["error"]
    assert [(r["batch"], r["k"]) for r in s["rows"]] == [(1, 3), (2, 3)]   # the --quick CPU sizes
    step = bench_run["doc"]["sections"]["roofline"]["data"]["median_step_s"]
    assert s["data"]["decode_step_s"] == step
    for r in s["rows"]:
        assert r["bytes_ratio_vs_vllm"] == pytest.approx(r["bytes"] / r["vllm_mrv2_bytes"], rel=1e-6)
        assert r["frac_decode_step"] == pytest.approx(r["seconds"] / step)
        # the Triton interpreter is far slower than a CPU decode step: that goal must show a miss
        assert "step: missed: " in r["status"] and "above the limit" in r["status"]
    assert (bench_run["out"] / "rejection_sampler.json").exists()
    assert "rejection_sampler.py's own table" in bench_run["md"]


def test_markdown_tables_and_plots(bench_run):
    md = bench_run["md"]
    for i, title in enumerate(("Batch-1 decode", "Verification", "Rejection sampler", "End to end",
                               "Peer", "Throughput under load"), start=1):
        assert f"## {i}. {title}" in md
    assert "## Goals at a glance" in md and "Date (UTC)" in md and "Device" in md
    goal_lines = [ln for ln in md.splitlines() if ln.startswith("| ") and "Goal" not in ln
                  and (">=" in ln or "<=" in ln or "within" in ln)]
    assert goal_lines
    for ln in goal_lines:
        assert any(w in ln for w in ("| met", "missed", "n/a", "skipped")), ln
    # every table row has as many cells as its header
    width = None
    for ln in md.splitlines() + [""]:
        if ln.startswith("|"):
            cells = ln.count("|") - ln.count("\\|")
            width = width or cells
            assert cells == width, ln
        else:
            width = None
    for name in ("e2e_tokens_per_s.png", "verify_cost.png", "serve_load.png", "sampler_bandwidth.png"):
        png = bench_run["out"] / name
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
        assert f"]({name})" in md
    doc = bench_run["doc"]
    assert set(doc["plots"]) >= {"e2e_tokens_per_s.png", "verify_cost.png", "serve_load.png",
                                 "sampler_bandwidth.png"}
    assert not math.isnan(doc["sections"]["roofline"]["data"]["fraction_of_roofline"])


def test_a_failing_pair_is_contained_and_fails_the_run(tmp_path):
    """A broken --pair-target fails its e2e rows and the exit status; the dummy pairs still run."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "specserve.server.cli", "bench", "--out", str(out), "--quick", "--device", "cpu",
           "--sections", "e2e", "--batch-sizes", "1", "--pair-target", str(tmp_path / "missing-t"),
           "--pair-draft", str(tmp_path / "missing-d"), "--no-plots"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    assert doc["failed_sections"] == ["e2e"]
    s = doc["sections"]["e2e"]
    assert "missing-t" in s["error"]
    assert len(s["data"]["pairs"]) == 2                       # self-draft and dummy pair measured
    failed = [r for r in s["rows"] if str(r["status"]).startswith("failed")]
    assert len(failed) == 1 and "missing-t" in failed[0]["label"], failed
    md = (out / "bench.md").read_text()
    assert "## 4. End to end" in md and "**failed:**" in md


# ---- section adaptive (issue 14) -------------------------------------------------------------
ADAPTIVE_KS = (1, 2, 4)          # the --quick preset


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench-adaptive") / "out"
    cmd = [sys.executable, "-m", "specserve.bench.cli", "--out", str(out), "--quick", "--device", "cpu",
           "--sections", "adaptive", "--adaptive-variants", "no-optimism"]
    env = _bench_env()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return {"out": out, "doc": json.loads((out / "bench.json").read_text()),
            "md": (out / "bench.md").read_text(), "stderr": proc.stderr, "seconds": seconds}


def test_adaptive_grid_rows_and_goals(adaptive_run):
    # a guard against the quick section ballooning, not a speed goal (those live in the bench):
    # it took 60-99 s on the 2-core CPU machine (94-99 s at both 3d23037 and 2aaeb89 on
    # 2026-11-29, where a bound of 90 s failed CI)
    assert adaptive_run["seconds"] < 240, "the --quick adaptive section should take a minute or two"
    s = _section(adaptive_run, "adaptive")
    cells = [r for r in s["rows"] if "ramp" not in r["pair"]]
    assert len(cells) == 3 * 2 * 2                          # pairs x temperatures x batch sizes
    assert {(r["temperature"], r["batch"]) for r in cells} == {(t, b) for t in (0.0, 1.0) for b in ("1", "4")}
    for r in s["rows"]:
        fixed = {k: r[f"k{k}"] for k in ADAPTIVE_KS}
        assert all(v > 0 for v in fixed.values()) and r["plain"] > 0 and r["adaptive"] > 0, r
        best = max(fixed, key=fixed.get)
        assert r["best_fixed_k"] == best
        if ramp_row(r):   # the ramp pairs its runs as the cells do (--quick: 2 pairs)
            ramp = s["data"]["ramp"]
            ratios = [a / p for p, a in zip(ramp["plain"]["runs"], ramp["adaptive"]["runs"])]
            assert ramp["adaptive"]["over_plain_runs"] == pytest.approx(ratios)
            assert r["adaptive_over_plain"] == pytest.approx(sum(ratios) / 2)
            assert [len(ramp[c]["runs"]) for c in ("plain", "adaptive", "k1")] == [2, 2, 2]   # fixed k too
        ramp = "ramp" in r["pair"]
        results = s["data"]["ramp"] if ramp else _cell(s, r)
        within_round = [a / f for a, f in zip(results["adaptive"]["runs"], results[f"k{best}"]["runs"])]
        assert len(within_round) == 2   # (--quick: 2 rounds of every configuration)
        assert r["adaptive_over_best_fixed"] == pytest.approx(sum(within_round) / 2)
        met = r["adaptive_over_best_fixed"] >= (1.0 if ramp else 0.95) and \
            (ramp or r["adaptive_over_plain"] >= 0.97)
        assert (r["status"] == "met") == met, r
        assert met or "missed" in r["status"]


def ramp_row(row: dict) -> bool:
    return "ramp" in row["pair"]


ADAPTIVE_PAIR_KEYS = {"unrelated dummy draft": "unrelated", "self-draft": "self", "truncated draft": "mid"}


def _cell(section: dict, row: dict) -> dict:
    """A cell row's runs by configuration, from the section's JSON data."""
    grid = section["data"]["grid"][ADAPTIVE_PAIR_KEYS[row["pair"]]]
    t, b = repr(float(row["temperature"])), row["batch"]
    return {c: by_t[t][b] for c, by_t in grid.items()}


def test_adaptive_cells_pair_no_spec_and_adaptive_runs(adaptive_run):
    """--quick runs 2 rounds per cell: each configuration shows its lower-middle run, and
    ad/no-spec is the median of the side-by-side ratios, not a ratio of the shown runs."""
    s = _section(adaptive_run, "adaptive")
    grid = s["data"]["grid"]
    by_label = {(r["pair"], r["temperature"], r["batch"]): r for r in s["rows"] if not ramp_row(r)}
    labels = {key: label for label, key in ADAPTIVE_PAIR_KEYS.items()}
    for pair, g in grid.items():
        for t, by_batch in g["adaptive"].items():
            for b, row in by_batch.items():
                plain = g["plain"][t][b]
                assert len(row["runs"]) == len(plain["runs"]) == 2
                assert plain["tok_per_s"] == min(plain["runs"]) and row["tok_per_s"] == min(row["runs"])
                ratios = [a / p for p, a in zip(plain["runs"], row["runs"])]
                assert row["over_plain_runs"] == pytest.approx(ratios)
                shown = by_label[(labels[pair], float(t), str(b))]
                assert shown["adaptive_over_plain"] == pytest.approx(sum(ratios) / 2)
            for c in ("k1", "k2", "k4"):   # every fixed k runs in every round too
                assert all(len(r["runs"]) == 2 and r["tok_per_s"] == min(r["runs"]) for r in g[c][t].values())


def test_a_controller_variant_runs_beside_adaptive_with_its_own_estimates(adaptive_run):
    """--adaptive-variants no-optimism: every cell and the ramp run the variant right after
    adaptive, paired with the same no-spec runs, and the report shows its ratio and mean k."""
    s = _section(adaptive_run, "adaptive")
    v = "adaptive:no-optimism"
    for pair, g in s["data"]["grid"].items():
        for t, by_batch in g[v].items():
            for b, row in by_batch.items():
                plain = g["plain"][t][b]
                assert len(row["runs"]) == 2 and sum(row["chosen_k"]) > 0
                assert row["over_plain_runs"] == pytest.approx([a / p for p, a in zip(plain["runs"], row["runs"])])
    assert v in s["data"]["ramp"]
    for r in s["rows"]:
        assert r[v] > 0 and r[f"{v}_over_plain"] > 0 and r[f"{v}_mean_k"] is not None, r
    assert "no-optimism/no-spec" in adaptive_run["md"]


def test_adaptive_pairs_accept_as_built(adaptive_run):
    d = _section(adaptive_run, "adaptive")["data"]
    acc = d["acceptance"]
    assert set(acc) == {"unrelated", "self", "mid"}
    # fp32 greedy: the target drafting for itself is accepted everywhere, an unrelated draft nowhere
    assert all(a == 1.0 for a in acc["self"]["0.0"]["per_position"])
    assert acc["unrelated"]["0.0"]["per_position"][0] < 0.2
    assert 0 < d["models"]["bytes_ratio"]["mid"] < 1 and d["models"]["softened_layers"] == 3
    for pair, grid in d["grid"].items():
        for c in [f"k{k}" for k in ADAPTIVE_KS] + ["adaptive"]:
            for t, by_batch in grid[c].items():
                for b, row in by_batch.items():
                    assert row["decode_tokens"] > 0 and row["tok_per_s"] > 0, (pair, c, t, b)
                    if c.startswith("k"):     # a fixed run drafts exactly k (less only near the end)
                        hist = row["chosen_k"]
                        assert max(i for i, n in enumerate(hist) if n) == int(c[1:]), (pair, c, hist)
        assert d["calibration"][pair]["batches"], pair


def test_adaptive_ramp_and_files(adaptive_run):
    d = _section(adaptive_run, "adaptive")["data"]
    ramp = d["ramp"]
    assert set(ramp) == {"plain", "adaptive", "adaptive:no-optimism"} | {f"k{k}" for k in ADAPTIVE_KS}
    n, length = d["settings"]["ramp_requests"], d["settings"]["ramp_output_len"]
    for c, r in ramp.items():
        assert r["tokens"] == n * length, c                  # every request ran to its length
        assert 1 < r["peak_batch"] <= n and r["tok_per_s"] > 0
    md = adaptive_run["md"]
    assert "## 7. Adaptive k" in md and "ramp 1 -> " in md
    for name in ("adaptive_unrelated.png", "adaptive_self.png", "adaptive_mid.png", "adaptive_ramp.png"):
        assert (adaptive_run["out"] / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({name})" in md
    assert "== section adaptive ==" in adaptive_run["stderr"]
