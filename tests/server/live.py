"""A real uvicorn on 127.0.0.1 around a real AsyncEngine, in a background thread of the test process.

Built through the same functions ``specserve serve`` uses (argv -> EngineConfig / ServerOptions ->
create_app -> uvicorn), so the CLI path is exercised too; running in-process lets tests look at
``engine.debug_state()`` and inject engine faults.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Mapping, Optional, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class LiveServer:
    """``specserve serve ARGV`` on a free loopback port, in this process."""

    def __init__(self, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None):
        from specserve.engine import AsyncEngine
        from specserve.server.app import create_app
        from specserve.server.cli import build_parser, engine_config, make_server, server_options

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        args = build_parser().parse_args(["serve", *argv, "--port", str(self.port), "--log-level",
                                          "warning", "--no-access-log"])
        self.options = server_options(args, environ or {})
        self.engine = AsyncEngine(engine_config(args))
        from specserve.server.tools import ToolOptions

        self.app = create_app(self.engine, tool_options=ToolOptions.from_args(args), served_model_name=self.options.served_model_name,
                              api_keys=self.options.api_keys,
                              shutdown_timeout=self.options.shutdown_timeout,
                              log_stats_interval=self.options.log_stats_interval)
        self.server = make_server(self.app, self.options)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        return self.app.state.server.served_model_name

    def start(self, timeout: float = 60.0) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=60)
        self._sock.close()

    def __enter__(self) -> "LiveServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """Poll until the engine holds no request, no used block and no draft probabilities."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.engine.debug_state()
            idle = (state["num_unfinished_requests"] == 0 and state["draft_prob_bytes"] == 0
                    and state["num_free_blocks"] == state["num_total_blocks"])
            if idle or time.monotonic() > deadline:
                return state
            time.sleep(0.02)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, sorted labels without model_name): value}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
