"""``specserve`` command line: argv + environment -> EngineConfig + ServerOptions -> uvicorn.

This is the only place that reads environment variables (``SPECSERVE_API_KEY`` or vLLM's
``VLLM_API_KEY``: comma-separated keys) and key files (``--api-key-file``).

Subcommands: ``serve`` here; ``bench`` lives in :mod:`specserve.bench.cli`, which registers itself
through ``add_subparser(subparsers)`` (its ``func=callable(args, environ) -> int`` default runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from specserve.engine.config import DEMO_MODEL, ConfigError, EngineConfig, SpeculativeConfig, parse_size
from specserve.server.tools import add_tool_flags
from specserve.server.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES
from specserve.server.preprocess import DEFAULT_TEMPLATE_TIMEOUT, DEFAULT_WORKERS
from specserve.server.stats_log import DEFAULT_INTERVAL_S

logger = logging.getLogger("specserve")

API_KEY_ENV = "SPECSERVE_API_KEY"
API_KEY_ENVS = (API_KEY_ENV, "VLLM_API_KEY")
SHUTDOWN_CUTOFF_GRACE = 5.0  # seconds uvicorn still waits after --shutdown-timeout for the 503s/error events
DEFAULT_NUM_SPECULATIVE_TOKENS = 4
EXIT_ENGINE_FAILED = 4  # the engine loop died and --exit-on-engine-failure is on


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: tuple[str, ...] = ()   # the first is reported; requests may use any
    api_keys: tuple[str, ...] = ()
    shutdown_timeout: float = 30.0
    log_level: str = "info"
    access_log: bool = True
    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    exit_on_engine_failure: bool = True
    engine_failure_grace: float = 2.0  # seconds between the engine's death and the exit
    enable_test_hooks: bool = False
    metrics_prefix: str = "specserve"
    log_stats_interval: Optional[float] = DEFAULT_INTERVAL_S   # None: --disable-log-stats
    request_body_timeout: float = DEFAULT_BODY_TIMEOUT
    preprocess_workers: int = DEFAULT_WORKERS
    trust_request_chat_template: bool = False
    chat_template_timeout: float = DEFAULT_TEMPLATE_TIMEOUT

    def __repr__(self) -> str:  # never print keys
        return (f"ServerOptions(host={self.host!r}, port={self.port}, served_model_name="
                f"{self.served_model_name!r}, api_keys=<{len(self.api_keys)} hidden>, "
                f"shutdown_timeout={self.shutdown_timeout}, log_level={self.log_level!r}, "
                f"max_request_body_bytes={self.max_request_body_bytes}, "
                f"exit_on_engine_failure={self.exit_on_engine_failure}, "
                f"enable_test_hooks={self.enable_test_hooks}, "
                f"log_stats_interval={self.log_stats_interval})")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEMO_MODEL, help="checkpoint directory, or 'demo' (default)")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    g.add_argument("--draft-model", default=None, help="draft checkpoint directory, or 'demo'")
    g.add_argument("--num-speculative-tokens", type=int, default=None,
                   help=f"k_max: the most draft tokens per step (default {DEFAULT_NUM_SPECULATIVE_TOKENS} "
                        "with a draft)")
    g.add_argument("--speculative-k", choices=["adaptive", "fixed"], default=None,
                   help="adaptive (default): choose k in 0..k_max every step from measured step costs "
                        "and live acceptance (0 = plain decoding); fixed: always k_max")
    g.add_argument("--speculative-config", default=None,
                   help='vLLM form: {"method":"draft_model","model":DIR,"num_speculative_tokens":K,'
                        '"speculative_k":"adaptive"}')
    g.add_argument("--rejection-sample-method", choices=["probabilistic", "strict"], default=None,
                   help="probabilistic (default): accept a draft with min(1, p/q) using the draft's "
                        "probabilities; strict: accept only when it equals the target's own sample "
                        "(also exact, accepts less)")
    g.add_argument("--draft-sample-method", choices=["sample", "greedy"], default=None,
                   help="sample (default): the draft samples inside the request's temperature/top-k/"
                        "top-p and keeps its probabilities; greedy: argmax drafts, no stored "
                        "probabilities (less memory, lower acceptance when sampling)")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default=d.dtype,
                   help="weights and KV cache; auto: the checkpoint's dtype on GPU, float32 on CPU")
    g.add_argument("--load-format", choices=["auto", "safetensors", "dummy"], default=d.load_format,
                   help="dummy: random weights from config.json alone (benchmarks at real sizes)")
    g.add_argument("--device", default=d.device, help="auto | cpu | cuda | cuda:N")
    g.add_argument("--kernel-backend", choices=["auto", "torch", "triton"], default=d.kernel_backend,
                   help="auto: Triton kernels on CUDA, the PyTorch reference kernels on CPU")
    g.add_argument("--no-gemv", dest="gemv", action="store_false", default=d.gemv,
                   help="linears of 1-8 rows (decode) use cuBLAS instead of the Triton GEMV "
                        "(kernels/triton_gemv.py); only matters with the triton backend")
    g.add_argument("--generation-config", default=d.generation_config,
                   help="request defaults (temperature, top_p, top_k, min_p, repetition_penalty, and "
                        "max_new_tokens as the default max_tokens): auto (default) = the model's "
                        "generation_config.json, vllm = none, or a folder holding a "
                        "generation_config.json; a request's own fields always win")
    g.add_argument("--seed", type=int, default=d.seed,
                   help="seeds dummy weights and the per-request seeds of requests that give none")
    c = p.add_argument_group("cache and scheduling")
    c.add_argument("--block-size", type=int, default=d.block_size,
                   help="tokens per KV-cache block (power of two)")
    c.add_argument("--num-kv-blocks", type=int, default=None,
                   help="force the KV pool size in blocks (overrides the memory-based sizing)")
    c.add_argument("--kv-cache-memory", default=None, help="e.g. 2GiB (target + draft KV)")
    c.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                   help="fraction of GPU memory for weights + KV cache (the rest is left free)")
    c.add_argument("--max-model-len", type=int, default=None,
                   help="context limit (prompt + output); default: the models' max_position_embeddings")
    c.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help="sequences running at once (each of a request's n counts)")
    c.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="token budget of one step; longer prompts are prefilled in chunks")
    c.add_argument("--max-waiting-requests", type=int, default=d.max_waiting_requests,
                   help="queued requests beyond this get HTTP 503 with Retry-After")
    c.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=d.enable_prefix_caching,
                   help="reuse the KV of full blocks of shared prompt prefixes (default on)")
    c.add_argument("--auto-fit-max-model-len", action="store_true",
                   help="when the KV cache cannot hold one request of --max-model-len tokens, lower "
                        "max_model_len to what it holds (with a warning) instead of refusing to start")
    c.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs (they are captured at start-up on GPU by default)")
    c.add_argument("--ragged-graph-tokens", type=int, default=d.ragged_graph_tokens,
                   help="prefill chunks, steps mixing prefill with decodes, and the draft's catch-up "
                        "of up to this many tokens replay CUDA graphs captured per token bucket "
                        "(16, 32, ... up to this) instead of launching every kernel from Python; "
                        "0 runs them eagerly (default %(default)s)")
    c.add_argument("--compile-workers", type=int, default=d.compile_workers,
                   help="on a GPU with an empty Triton cache, processes that compile the "
                        "sampler's kernel variants in parallel before the weights load (a few "
                        "minutes of compiling in the server process alone at large k and batch); "
                        "later start-ups read them from Triton's cache and skip this. Default: one "
                        "per spare CPU core, at most 8 and as many as free GPU memory holds at 4 GB "
                        "each; 0 compiles them in the server process")
    c.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   default=d.async_scheduling,
                   help="overlap the host's work with the GPU's (exact; default on): a plain "
                        "decode step (no speculation, or adaptive k holding every request at "
                        "k = 0) is queued before the previous step's tokens are read; any other "
                        "step is queued as soon as the previous one's tokens are committed, "
                        "before their text and the outputs are built")
    c.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size,
                   help="split the target over this many GPUs, one process each (NCCL; gloo on CPU); "
                        "the engine and the draft run on rank 0 (default %(default)s)")


def _add_server_flags(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("server")
    s.add_argument("--host", default=ServerOptions.host, help="address to listen on (default %(default)s)")
    s.add_argument("--port", type=int, default=ServerOptions.port, help="port (default %(default)s)")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="the model id(s) clients send and /v1/models lists; the first is the one "
                        "responses report (default: --model as given, or 'demo')")
    s.add_argument("--api-key", action="append", default=[],
                   help=f"required bearer key for /v1/* (repeatable; shows in `ps`: prefer --api-key-file "
                        f"or ${API_KEY_ENV} / $VLLM_API_KEY, comma-separated)")
    s.add_argument("--api-key-file", action="append", default=[],
                   help="a file holding bearer keys, one per line (repeatable; e.g. a mounted Secret)")
    s.add_argument("--shutdown-timeout", type=float, default=ServerOptions.shutdown_timeout,
                   help="seconds SIGTERM waits for in-flight requests before aborting them")
    s.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"],
                   default=ServerOptions.log_level, help="log verbosity (default %(default)s)")
    s.add_argument("--no-access-log", action="store_true", help="do not log every HTTP request")
    s.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic stats log line (throughput, queue, KV cache, prefix cache, "
                        "spec-decode acceptance)")
    s.add_argument("--log-stats-interval", type=float, default=DEFAULT_INTERVAL_S,
                   help="seconds between stats log lines while requests run (default %(default)s)")
    s.add_argument("--metrics-prefix", choices=("specserve", "vllm"), default=ServerOptions.metrics_prefix,
                   help="Prometheus names: specserve:* (default), or vllm:* with vLLM's `engine` label, "
                        "for vLLM dashboards, alerts and inference-gateway endpoint pickers")
    s.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies get HTTP 413 (default %(default)s)")
    s.add_argument("--request-body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT,
                   help="seconds a request body may take to arrive; slower ones get HTTP 408 and the "
                        "connection is closed (default %(default)s)")
    s.add_argument("--preprocess-workers", type=int, default=DEFAULT_WORKERS,
                   help="threads that tokenize prompts and render chat templates, off the event loop "
                        "(default %(default)s)")
    s.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept chat templates sent with requests (chat_template, "
                        "chat_template_kwargs.chat_template); they render in a sandboxed child process "
                        "bounded in time and output. Off: such requests get HTTP 400")
    s.add_argument("--chat-template-timeout", type=float, default=DEFAULT_TEMPLATE_TIMEOUT,
                   help="seconds one request-supplied chat template may render (default %(default)s)")
    s.add_argument("--exit-on-engine-failure", action=argparse.BooleanOptionalAction, default=True,
                   help=f"exit with status {EXIT_ENGINE_FAILED} shortly after the engine loop fails, so "
                        "the orchestrator restarts the server (default on; off: stay up, /health 503)")
    add_tool_flags(p.add_argument_group("tool calling"))
    s.add_argument("--enable-test-hooks", action="store_true",
                   help="TEST ONLY, never in production: adds POST /debug/fault (behind the API key), "
                        "which makes the next engine step raise")


def _speculative(args: argparse.Namespace) -> SpeculativeConfig:
    methods = {k: v for k, v in (("rejection_sample_method", args.rejection_sample_method),
                                  ("draft_sample_method", args.draft_sample_method),
                                  ("speculative_k", args.speculative_k)) if v is not None}
    k = args.num_speculative_tokens
    if args.speculative_config is not None:
        if args.draft_model is not None or k is not None:
            raise ConfigError("use either --speculative-config or --draft-model/--num-speculative-tokens")
        base = SpeculativeConfig.from_json(args.speculative_config)
        return SpeculativeConfig(base.model, base.num_speculative_tokens,
                                 methods.get("rejection_sample_method", base.rejection_sample_method),
                                 methods.get("draft_sample_method", base.draft_sample_method),
                                 methods.get("speculative_k", base.speculative_k))
    draft = args.draft_model
    if draft is None and args.model == DEMO_MODEL:
        draft = DEMO_MODEL  # the demo pair brings its own draft
    if draft is None:
        if k:
            raise ConfigError("--num-speculative-tokens needs a draft model (--draft-model DIR)")
        return SpeculativeConfig(**methods)
    if k == 0:
        return SpeculativeConfig(**methods)  # speculation explicitly off
    k = DEFAULT_NUM_SPECULATIVE_TOKENS if k is None else k
    return SpeculativeConfig(model=draft, num_speculative_tokens=k, **methods)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The serve flags -> EngineConfig (raises ConfigError with the flag's name)."""
    return EngineConfig(
        model=args.model, tokenizer=args.tokenizer,
        served_model_name=next(iter(served_names(args)), None),
        speculative=_speculative(args), dtype=args.dtype, load_format=args.load_format,
        device=args.device, kernel_backend=args.kernel_backend, gemv=args.gemv, seed=args.seed,
        block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory=parse_size(args.kv_cache_memory),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_waiting_requests=args.max_waiting_requests, enforce_eager=args.enforce_eager,
        ragged_graph_tokens=args.ragged_graph_tokens, compile_workers=args.compile_workers,
        async_scheduling=args.async_scheduling,
        tensor_parallel_size=args.tensor_parallel_size,
        generation_config=args.generation_config,
        kv_shortfall="lower" if args.auto_fit_max_model_len else "refuse")


def api_keys(cli_keys: Sequence[str], environ: Mapping[str, str],
             key_files: Sequence[str] = ()) -> tuple[str, ...]:
    """Keys from --api-key, --api-key-file (one per line) and $SPECSERVE_API_KEY / $VLLM_API_KEY."""
    keys = [k.strip() for k in cli_keys]
    for path in key_files:
        try:
            with open(path, encoding="utf-8") as f:
                keys += [line.strip() for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--api-key-file {path}: cannot read it ({type(e).__name__})") from None
    for name in API_KEY_ENVS:
        keys += [k.strip() for k in environ.get(name, "").split(",")]
    return tuple(dict.fromkeys(k for k in keys if k))


def served_names(args: argparse.Namespace) -> tuple[str, ...]:
    """``--served-model-name`` A [B ...]: the names, in order, without blanks or repeats."""
    names = tuple(dict.fromkeys(n.strip() for n in args.served_model_name or () if n.strip()))
    if args.served_model_name is not None and not names:
        raise ConfigError("--served-model-name needs a non-empty name")
    return names


def server_options(args: argparse.Namespace, environ: Mapping[str, str]) -> ServerOptions:
    if not 0 <= args.port <= 65535:
        raise ConfigError("--port must be between 0 and 65535")
    if args.shutdown_timeout < 0:
        raise ConfigError("--shutdown-timeout must be >= 0")
    if args.max_request_body_bytes < 1:
        raise ConfigError("--max-request-body-bytes must be positive")
    if not args.log_stats_interval > 0:
        raise ConfigError("--log-stats-interval must be positive")
    if not args.request_body_timeout > 0:
        raise ConfigError("--request-body-timeout must be positive")
    if args.preprocess_workers < 1:
        raise ConfigError("--preprocess-workers must be positive")
    if not args.chat_template_timeout > 0:
        raise ConfigError("--chat-template-timeout must be positive")
    keys = api_keys(args.api_key, environ, args.api_key_file)
    if args.api_key_file and not keys:
        raise ConfigError("--api-key-file holds no key")
    return ServerOptions(host=args.host, port=args.port, served_model_name=served_names(args),
                         api_keys=keys, shutdown_timeout=args.shutdown_timeout,
                         log_level=args.log_level, access_log=not args.no_access_log,
                         max_request_body_bytes=args.max_request_body_bytes,
                         exit_on_engine_failure=args.exit_on_engine_failure,
                         enable_test_hooks=args.enable_test_hooks, metrics_prefix=args.metrics_prefix,
                         log_stats_interval=None if args.disable_log_stats else args.log_stats_interval,
                         request_body_timeout=args.request_body_timeout,
                         preprocess_workers=args.preprocess_workers,
                         trust_request_chat_template=args.trust_request_chat_template,
                         chat_template_timeout=args.chat_template_timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserve", description="OpenAI-compatible server with "
                                     "lossless speculative decoding (separate draft model).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI API")
    _add_engine_flags(serve)
    _add_server_flags(serve)
    serve.set_defaults(func=run_serve)
    from specserve.bench.cli import add_subparser as add_bench_subparser

    add_bench_subparser(sub)
    return parser


def _describe(engine: Any, name: str, opts: ServerOptions) -> str:
    """One start-up line: what was loaded, on which device, KV capacity, the URL, whether keys guard it."""
    info = engine.info
    draft = (f"draft {info.draft_model_path} (k={info.num_speculative_tokens}, "
             f"{info.rejection_sample_method} verification, {info.draft_sample_method} drafts)"
             if info.draft_model_path and info.num_speculative_tokens > 0 else "no draft (speculation off)")
    return (f"serving '{name}' = target {info.model_path} + {draft} on {info.device} ({info.dtype}); "
            f"KV cache {info.kv_capacity_tokens} tokens ({info.num_kv_blocks} x {info.block_size}); "
            f"max_model_len {info.max_model_len}; at http://{opts.host}:{opts.port} "
            f"({'API key required on /v1/*' if opts.api_keys else 'no API key'})")


def _cut_off(engine: Any, timeout: float) -> None:
    ended = engine.cut_off(f"the server is shutting down: --shutdown-timeout ({timeout:g} s) ran out "
                           "before this request finished")
    if ended:
        logger.warning("shutdown timeout (%gs) reached: ended %d unfinished request(s) with 503 / an "
                       "error event", timeout, ended)


def make_server(app: Any, opts: ServerOptions) -> Any:
    import uvicorn

    class _Server(uvicorn.Server):
        engine_failed = False
        _dead_since: Optional[float] = None

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                state = app.state.server
                logger.info("%s", _describe(state.engine, state.served_model_name, opts))

        async def shutdown(self, sockets: Any = None) -> None:
            """SIGTERM: uvicorn stops accepting and waits for open requests. When --shutdown-timeout
            runs out, the leftovers are ended here, properly (a 503 body, or an error event then
            [DONE] on a stream), while uvicorn still waits SHUTDOWN_CUTOFF_GRACE more seconds for
            those answers to go out before it would cancel anything."""
            cutoff = asyncio.get_running_loop().call_later(opts.shutdown_timeout, _cut_off,
                                                           app.state.server.engine, opts.shutdown_timeout)
            try:
                await super().shutdown(sockets)
            finally:
                cutoff.cancel()

        async def on_tick(self, counter: int) -> bool:
            """Every 0.1 s: once the engine is dead and the grace period (error events flushed,
            /health seen as 503) is over, shut down so that the process exits non-zero."""
            engine = app.state.server.engine
            if opts.exit_on_engine_failure and engine.is_dead and not self.engine_failed:
                now = time.monotonic()
                if self._dead_since is None:
                    self._dead_since = now
                    logger.error("the engine failed (%s); exiting in %.1fs", engine.dead_error,
                                 opts.engine_failure_grace)
                elif now - self._dead_since >= opts.engine_failure_grace:
                    self.engine_failed = True
                    self.should_exit = True
            return await super().on_tick(counter)

    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level=opts.log_level,
                            access_log=opts.access_log,
                            timeout_graceful_shutdown=opts.shutdown_timeout + SHUTDOWN_CUTOFF_GRACE,
                            log_config=None)
    return _Server(config)


def run_serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Load the engine, then serve until SIGTERM/SIGINT (drained, exit 0)."""
    try:
        config = engine_config(args)
        opts = server_options(args, environ)
    except ConfigError as e:
        print(f"specserve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=opts.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from specserve.engine import AsyncEngine
    from specserve.engine.heap import settle_after_startup
    from specserve.server.app import create_app
    from specserve.server.tools import ToolOptions

    try:
        engine = AsyncEngine(config)
    except (ConfigError, FileNotFoundError, NotImplementedError) as e:
        print(f"specserve: error: cannot load the model: {e}", file=sys.stderr)
        return 2
    app = create_app(engine, tool_options=ToolOptions.from_args(args), served_model_name=opts.served_model_name, api_keys=opts.api_keys,
                     shutdown_timeout=opts.shutdown_timeout,
                     max_body_bytes=opts.max_request_body_bytes,
                     enable_test_hooks=opts.enable_test_hooks, metrics_prefix=opts.metrics_prefix,
                     log_stats_interval=opts.log_stats_interval,
                     body_timeout=opts.request_body_timeout, preprocess_workers=opts.preprocess_workers,
                     trust_request_chat_template=opts.trust_request_chat_template,
                     chat_template_timeout=opts.chat_template_timeout)
    if opts.trust_request_chat_template:
        logger.warning("--trust-request-chat-template is on: clients may send chat templates (rendered "
                       "in a sandboxed child process, %gs and %d characters at most)",
                       opts.chat_template_timeout, app.state.server.preprocess.max_rendered_chars)
    logger.info("preprocessing: %d worker threads; %s", opts.preprocess_workers,
                app.state.server.preprocess.describe())
    if opts.enable_test_hooks:
        logger.warning("--enable-test-hooks is on: POST /debug/fault can kill the engine (tests only)")
    settle_after_startup()   # engine/heap.py: no full GC passes over the models while serving
    server = make_server(app, opts)
    # uvicorn re-raises the captured signal once it has shut down; with these handlers in place that
    # re-raise is a no-op, so a drained SIGTERM ends with exit status 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if getattr(server, "engine_failed", False):
        print(f"specserve: error: the engine failed: {engine.dead_error}", file=sys.stderr)
        return EXIT_ENGINE_FAILED
    return 0 if server.started else 3


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """The ``specserve`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    env = os.environ if environ is None else environ
    return int(args.func(args, env) or 0)


if __name__ == "__main__":
    sys.exit(main())
