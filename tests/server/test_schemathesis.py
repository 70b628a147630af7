"""schemathesis over the live server's own OpenAPI document: no 5xx, no undocumented status code,
responses match their documented content types and schemas.

A server of its own with a 32-token context keeps every generated request cheap on CPU.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)

from tests.server.conftest import API_KEY, server_argv
from tests.server.live import LiveServer

MAX_EXAMPLES = 20
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_server(tiny_pair):
    argv = server_argv(tiny_pair, "--api-key", API_KEY)
    argv[argv.index("--max-model-len") + 1] = "32"
    with LiveServer(argv) as live:
        yield live


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_openapi_conformance(fuzz_server, mode) -> None:
    """Every operation, schema-valid (positive) and schema-violating (negative) inputs.

    Driven through hypothesis directly: schemathesis' lazy pytest fixture does not run under pytest 9.
    """
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not (operation.body or operation.query
                                                    or operation.path_parameters):
            continue  # no input that could be made invalid (the GETs, POST /ping)

        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {API_KEY}"}, checks=CHECKS,
                                   timeout=60)

        try:
            check()
        except Exception as e:  # noqa: BLE001 - gather every operation's failure, then report all
            failures.append(f"{operation.label}: {e}")
    assert not failures, "\n\n".join(failures)
    assert httpx.get(f"{fuzz_server.url}/health").status_code == 200  # still serving


def test_document_has_no_422_and_declares_errors(fuzz_server) -> None:
    doc = httpx.get(f"{fuzz_server.url}/openapi.json").json()
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "422" not in op["responses"], path
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "503"} <= set(completions)
    assert "text/event-stream" in completions["200"]["content"]
