"""bench/adaptive.py's cells: each configuration runs the cell's own prompts once, untimed,
before the timed rounds (first-use costs at a new batch size land there)."""

from __future__ import annotations

from types import SimpleNamespace

from specserve.bench import adaptive as ad
from specserve.bench.engines import GenerationRun


def _grid_calls(monkeypatch, warmup_tokens: int) -> list[tuple[str, int, int]]:
    calls: list[tuple[str, int, int]] = []

    def fake_generate(core, prompts, temperature, output_len, tag):
        calls.append((tag, len(prompts), output_len))
        run = GenerationRun(batch=len(prompts), output_len=output_len, decode_tokens=len(prompts),
                            decode_seconds=1.0 + len(calls) / 100, decode_steps=output_len)
        return ad.CellRun(run)

    monkeypatch.setattr(ad, "generate", fake_generate)
    s = ad.script_settings((4, 16), (0.0,), ks=(2,), cell_warmup_tokens=warmup_tokens)
    # (plain and adaptive: a fixed k swaps a real engine's controller, which this fake lacks)
    core = SimpleNamespace(info=SimpleNamespace(vocab_size=100), spec_control=object())
    plain = SimpleNamespace(info=core.info, spec_control=None)
    out = ad.measure_grid(core, s, "t", ["plain", "adaptive"], {}, lambda msg: None,
                          plain_core=plain, repeats=2)
    assert [len(out[c][0.0][b]["runs"]) for c in out for b in (4, 16)] == [2] * 4
    return calls


def test_each_config_runs_a_cells_prompts_untimed_before_its_rounds(monkeypatch):
    calls = _grid_calls(monkeypatch, 16)
    for batch in (4, 16):
        cell = [c for c in calls if c[0].split("-")[3] == str(batch)]   # (label-config-T-batch-...)
        # the untimed runs: every configuration once, 16 tokens, before any timed run
        assert [c[0].rsplit("-", 1)[-1] for c in cell[:2]] == ["warm"] * 2
        assert {c[0].split("-")[1] for c in cell[:2]} == {"plain", "adaptive"}
        assert [c[2] for c in cell[:2]] == [16] * 2
        assert all(not c[0].endswith("warm") for c in cell[2:]) and len(cell) == 2 + 2 * 2


def test_no_untimed_cell_runs_when_asked_for_none(monkeypatch):
    calls = _grid_calls(monkeypatch, 0)
    assert not any(c[0].endswith("-warm") for c in calls)
