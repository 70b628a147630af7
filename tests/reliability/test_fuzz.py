"""schemathesis over the server's own OpenAPI document, schema-valid and schema-violating inputs,
every operation (the /debug/state route included): no 5xx, no undocumented status, responses as
documented; afterwards the engine is alive and holds nothing.

Its own server with a 32-token context keeps every generated request cheap on CPU. Hypothesis is
derandomized (fixed examples, no example database), so a run is reproducible.
"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.reliability.conftest import API_KEY, serve_argv, start_server
from tests.helpers.server_process import ServerProcess

MAX_EXAMPLES = 100
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_srv(pair) -> Iterator[ServerProcess]:
    argv = serve_argv(pair)
    argv[argv.index("--max-model-len") + 1] = "32"
    with start_server(pair, argv=argv) as s:
        yield s


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_fuzz_finds_no_server_error(fuzz_srv: ServerProcess, mode: GenerationMode, ledger) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_srv.url}/openapi.json")
    failures: list[str] = []
    calls = {"n": 0, "5xx": 0}
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case) -> None:
            calls["n"] += 1
            response = case.call(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
            calls["5xx"] += response.status_code >= 500
            case.validate_response(response, checks=CHECKS)

        try:
            check()
        except Unsatisfiable:  # nothing to violate (an operation without parameters or body)
            continue
        except Exception as e:  # noqa: BLE001 - gather every operation's failure, then report all
            failures.append(f"{operation.label}: {e}")
    ledger.add("fuzz", f"{mode.value} cases", calls["n"])
    ledger.add("fuzz", "5xx", calls["5xx"])
    assert not failures, "\n\n".join(failures)
    assert calls["5xx"] == 0
    state = fuzz_srv.wait_idle()
    assert not state["engine_dead"] and state["num_free_blocks"] == state["num_total_blocks"], state
    assert httpx.get(f"{fuzz_srv.url}/health", timeout=10).status_code == 200
