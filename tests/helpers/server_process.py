"""``specserve serve`` as a real child process on a free 127.0.0.1 port: the one way tests start it.

The process writes stdout and stderr to a log file; :meth:`ServerProcess.wait_ready` polls
``/health`` until it answers 200 and fails with the log's tail if the process exits or the
timeout passes; :meth:`ServerProcess.stop` sends SIGTERM to the process group, then SIGKILL if it
is still there after a grace period. Nothing inside the process is reached into: tests see it
the way Kubernetes and clients do (HTTP, signals, the exit status and the log).
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
SERVE = (sys.executable, "-m", "specserve.server.cli", "serve")
LOG_TAIL_CHARS = 4000


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer /health in time; the message holds its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``specserve serve ARGV --host 127.0.0.1 --port P`` in its own process group.

    ``environ`` is added to this process's environment (``drop_env`` names removed from it);
    ``command`` replaces ``python -m specserve.server.cli serve`` (e.g. the installed script);
    ``log_path`` keeps the log where the test wants it (otherwise a temporary file, removed by
    :meth:`close`); ``api_key`` goes into :attr:`headers` for the guarded routes;
    ``start_timeout`` bounds :meth:`wait_ready` (and so ``with ServerProcess(...)``).
    """

    def __init__(self, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None, *,
                 command: Sequence[str] = SERVE, log_path: Optional[Path] = None,
                 api_key: Optional[str] = None, drop_env: Sequence[str] = (),
                 start_timeout: float = 90.0):
        self.port = free_port()
        self.start_timeout = start_timeout
        self.api_key = api_key
        self._own_log = log_path is None
        if log_path is None:
            with tempfile.NamedTemporaryFile(prefix="specserve-", suffix=".log", delete=False) as f:
                log_path = Path(f.name)
        self.log_path = Path(log_path)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1", **(environ or {})}
        for name in drop_env:
            env.pop(name, None)
        self.cmd = [*command, *argv, "--host", "127.0.0.1", "--port", str(self.port)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: Optional[float] = None) -> "ServerProcess":
        """Return once /health answers 200 (within ``timeout``, by default ``start_timeout``
        seconds); else stop the process and raise ServerNotReady."""
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ServerNotReady(f"`{' '.join(self.cmd)}` exited with {self.proc.returncode}:\n"
                                     f"{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServerNotReady(f"`{' '.join(self.cmd)}` did not answer /health within {timeout:.0f} s:\n"
                                     f"{self.log_tail()}")
            time.sleep(0.1)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return self.logs()[-chars:]

    def send(self, sig: int = signal.SIGTERM) -> None:
        """A signal to the server process itself (as Kubernetes sends SIGTERM to PID 1)."""
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the process group; SIGKILL if it still runs after ``grace`` seconds."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL to the process group (what is left of it), then reap the server."""
        self._signal_group(signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):  # the whole group has already gone
            pass

    def close(self) -> None:
        """Stop the process and remove its log file if it is a temporary one."""
        self.stop()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def state(self) -> dict:
        """/debug/state (the engine's requests, blocks and drafts)."""
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
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_idle(state: dict) -> bool:
    return (state["num_unfinished_requests"] == 0 and state["num_streams"] == 0
            and state["draft_prob_bytes"] == 0 and state["num_free_blocks"] == state["num_total_blocks"])
