"""``specserve serve`` as a real child process on a free 127.0.0.1 port.

The reliability tests talk to the server the way Kubernetes and clients do: HTTP, signals, the
exit status and the log stream. Nothing inside the process is reached into.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m server.cli serve ARGV --port P``; stdout+stderr go to a log file."""

    def __init__(self, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None,
                 api_key: Optional[str] = None):
        self.port = free_port()
        self.api_key = api_key
        self._log = tempfile.NamedTemporaryFile(prefix="specserve-", suffix=".log", delete=False)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1", **(environ or {})}
        cmd = [sys.executable, "-m", "specserve.server.cli", "serve", *argv, "--host", "127.0.0.1",
               "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 90.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def send(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def state(self) -> dict:
        r = httpx.get(f"{self.url}/debug/state", headers=self.headers, timeout=10)
        r.raise_for_status()
        return r.json()

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """Poll /debug/state until nothing is held (or the timeout passes); the last state."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.state()
            if is_idle(s) or time.monotonic() > deadline:
                return s
            time.sleep(0.05)

    def __enter__(self) -> "ServerProcess":
        try:
            return self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the process if it still runs and remove its log file."""
        self.kill()
        self._log.close()
        if os.path.exists(self._log.name):
            os.unlink(self._log.name)


def is_idle(state: dict) -> bool:
    return (state["num_unfinished_requests"] == 0 and state["num_streams"] == 0
            and state["draft_prob_bytes"] == 0 and state["num_free_blocks"] == state["num_total_blocks"])
