"""Fixtures for the deployment tests: a real helm with private homes, renders cached per scenario."""

from __future__ import annotations

import pytest

from tests.deploy._tools import CHART, Helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def render(helm: Helm):
    """render(scenario) -> objects of ``helm template`` with helm/specserve/ci/<scenario>-values.yaml."""
    cache: dict[str, list[dict]] = {}

    def _render(scenario: str) -> list[dict]:
        if scenario not in cache:
            values = CHART / "ci" / f"{scenario}-values.yaml"
            assert values.is_file(), values
            cache[scenario] = helm.template("--values", str(values))
        return cache[scenario]

    return _render


def scenarios() -> list[str]:
    return sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))

