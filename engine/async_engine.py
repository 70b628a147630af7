"""AsyncEngine: the EngineCore on a background thread, with one asyncio stream per request.

The step thread owns the EngineCore; the event loop talks to it only through an inbox (new
requests, aborts) and receives outputs through ``loop.call_soon_threadsafe``. Model forward
passes release the GIL, so the event loop keeps serving HTTP while a step runs.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

from specserve.engine.config import EngineConfig
from specserve.engine.core import EngineCore
from specserve.engine.errors import EngineDeadError, QueueFullError
from specserve.engine.setup import EngineInfo
from specserve.engine.types import RequestOutput, SamplingParams, StepStats

log = logging.getLogger("specserve.engine")

StepListener = Callable[[StepStats], None]


class RequestStream:
    """Async iterator of cumulative RequestOutputs; the last one has ``finished`` set."""

    def __init__(self, engine: "AsyncEngine", request_id: str):
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.num_seqs = 1

    def _put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    async def aclose(self) -> None:
        """Stop listening; an unfinished request is aborted (its KV and drafts are freed)."""
        if not self.finished:
            self.finished = True
            await self._engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.core = EngineCore(config)
        self.info: EngineInfo = self.core.info
        self.tokenizer = self.core.tokenizer
        self._streams: dict[str, RequestStream] = {}
        self._inbox: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self._wake = threading.Event()
        self._listeners: list[StepListener] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._accepting = True
        self._num_running = 0     # sequences running after the last step
        self._num_seqs = 0        # sequences of all unfinished streams
        self.is_dead = False
        self.dead_error: Optional[str] = None
        self._fault_next_step: Optional[str] = None

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests, let in-flight ones finish (up to ``timeout``), abort the rest."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline and not self.is_dead:
            await asyncio.sleep(0.05)
        for rid in list(self._streams):
            await self.abort(rid)
        await asyncio.sleep(0)
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)

    def cut_off(self, message: str) -> int:
        """End every in-flight request now (the shutdown deadline has passed): each stream gets
        ``EngineDeadError(message)`` at once, so its handler answers with a 503 or an error event,
        and the engine aborts the requests (freeing their KV and drafts). Returns how many."""
        self._accepting = False
        rids = list(self._streams)
        for rid in rids:
            self._inbox.put(("abort", rid))
            self._deliver_error(rid, EngineDeadError(message))
        self._wake.set()
        return len(rids)

    def add_step_listener(self, fn: StepListener) -> None:
        self._listeners.append(fn)

    # ---- requests ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt_text: Optional[str] = None) -> RequestStream:
        """Validate and enqueue; raises ParamError / QueueFullError / EngineDeadError at once."""
        if self.is_dead:
            raise EngineDeadError(f"the engine has stopped: {self.dead_error}")
        if not self._accepting or self._stop:
            raise EngineDeadError("the server is shutting down and accepts no new requests")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        # one unit throughout: sequences (a request with n > 1 is n of them), as the scheduler runs them
        waiting = self._num_seqs - self._num_running
        if waiting >= self.config.max_waiting_requests:
            raise QueueFullError(waiting, self.config.max_waiting_requests)
        self.core.validate(prompt_token_ids, params)
        stream = RequestStream(self, request_id)
        stream.num_seqs = params.n
        self._num_seqs += params.n
        self._streams[request_id] = stream
        self._inbox.put(("add", request_id, list(prompt_token_ids), params, prompt_text, time.monotonic()))
        self._wake.set()
        return stream

    async def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self._inbox.put(("abort", request_id))
            self._wake.set()

    def debug_state(self) -> dict:
        state = self.core.debug_state()
        state["num_streams"] = len(self._streams)
        return state

    def inject_fault(self, message: str = "injected fault") -> None:
        """Test-only hook: the next engine step raises RuntimeError(message)."""
        self._fault_next_step = message
        self._wake.set()

    # ---- the step thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                self._drain_inbox()
                if not self.core.has_unfinished():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                if self._fault_next_step:
                    msg, self._fault_next_step = self._fault_next_step, None
                    raise RuntimeError(msg)
                outputs, stats = self.core.step()
                self._post(outputs, stats)
        except Exception as e:  # the engine cannot be trusted after an error inside a step
            log.exception("engine step failed; failing all in-flight requests")
            self._die(f"{type(e).__name__}: {e}")

    def _drain_inbox(self) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "add":
                _, rid, ids, params, text, arrival = msg
                try:
                    self.core.add_request(rid, ids, params, text, arrival)
                except Exception as e:
                    self._post_error(rid, e)
            else:
                self._post(self.core.abort([msg[1]]), None)

    def _post(self, outputs: list[RequestOutput], stats: Optional[StepStats]) -> None:
        if self._loop is not None and (outputs or stats is not None):
            self._loop.call_soon_threadsafe(self._deliver, outputs, stats)

    def _post_error(self, rid: str, error: BaseException) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._deliver_error, rid, error)

    def _die(self, message: str) -> None:
        self.is_dead = True
        self.dead_error = message
        try:
            outputs = self.core.fail_all(message)
        except Exception:
            outputs = []
        self._post(outputs, None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_remaining, message)

    # ---- on the event loop ---------------------------------------------------------------
    def _deliver(self, outputs: list[RequestOutput], stats: Optional[StepStats]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream._put(out)
            if out.finished:
                del self._streams[out.request_id]
                self._num_seqs -= stream.num_seqs
        if stats is not None:
            self._num_running = stats.num_running
            for fn in self._listeners:
                try:
                    fn(stats)
                except Exception:
                    log.exception("step listener failed")

    def _deliver_error(self, rid: str, error: BaseException) -> None:
        stream = self._streams.pop(rid, None)
        if stream is not None:
            self._num_seqs -= stream.num_seqs
            stream._put(error)

    def _fail_remaining(self, message: str) -> None:
        for rid in list(self._streams):
            self._deliver_error(rid, EngineDeadError(message))
