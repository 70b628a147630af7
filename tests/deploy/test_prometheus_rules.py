"""Recording rules and alerts: promtool check + promtool's own unit tests, and proof they can fail."""

from __future__ import annotations

from pathlib import Path

from tests.deploy._tools import CHART, RULES, RULES_TEST, find_tool, run


def test_rules_are_valid() -> None:
    proc = run([find_tool("promtool"), "check", "rules", str(RULES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 10 rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = run([find_tool("promtool"), "test", "rules", str(RULES_TEST)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """A collapse threshold of 0.05 instead of 0.5 must make the promtool tests fail."""
    broken = RULES.read_text().replace("< 0.5 * (avg_over_time", "< 0.05 * (avg_over_time")
    assert broken != RULES.read_text()
    (tmp_path / "specserve-rules.yml").write_text(broken)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "t.yml").write_text(RULES_TEST.read_text())
    proc = run([find_tool("promtool"), "test", "rules", str(tests / "t.yml")])
    assert proc.returncode != 0
    assert "SpecserveAcceptanceCollapsed" in proc.stdout + proc.stderr


def test_chart_links_the_same_rules_file() -> None:
    assert (CHART / "rules" / "specserve-rules.yml").resolve() == RULES.resolve()
