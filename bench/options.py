"""``specserve bench`` flags -> :class:`BenchOptions` (full-size defaults, or ``--quick`` ones)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

SECTIONS = ("roofline", "verify", "sampler", "e2e", "peer", "serve", "adaptive")
# what runs without --sections: adaptive (about 7 minutes on an H100 by itself) is asked for by name
DEFAULT_SECTIONS = SECTIONS[:6]
ADAPTIVE_TARGETS = ("1.7b", "4b")
ADAPTIVE_PAIRS = ("unrelated", "self", "mid")   # the drafts of section adaptive (bench/sections_adaptive.py)
# controller variants section adaptive can run beside the default one (bench/adaptive.py VARIANTS)
ADAPTIVE_VARIANTS = ("no-optimism", "aging", "schedule-probes", "no-tail-pricing",
                     "no-evidence-no-tail", "coarse-phases", "held-zero")


@dataclass(frozen=True)
class BenchOptions:
    out: str
    device: str = "auto"
    dtype: Optional[str] = None             # None: bfloat16 on CUDA, float32 on CPU
    kernel_backend: str = "auto"
    enforce_eager: bool = False
    ragged_graph_tokens: int = 1024          # engines' --ragged-graph-tokens (0: eager prefill)
    quick: bool = False
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    seed: int = 0
    k: int = 4
    batch_sizes: tuple[int, ...] = (1, 16, 64)
    prompt_len: int = 128
    output_len: int = 128
    max_model_len: int = 1024
    decode_warmup: int = 8
    decode_steps: int = 64
    warmup: int = 5                          # forward timings: warm-up calls
    repeats: int = 20                        # forward timings: timed calls (median)
    verify_ks: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    verify_context: int = 256
    bandwidth_bytes: int = 1 << 30
    bandwidth_repeats: int = 20
    peer_repeats: int = 3
    pair_target: Optional[str] = None       # default: the embedded demo pair
    pair_draft: Optional[str] = None
    serve_concurrency: tuple[int, ...] = (1, 16, 64)
    serve_requests: Optional[int] = None    # per level; default 2 x concurrency, at least 8, at most 128
    serve_output_len: int = 64
    serve_stream: bool = True               # False: responses in one body (no TTFT / ITL / TPOT)
    serve_log_level: str = "warning"        # the server's --log-level (serve.log)
    # load clients, each level run with each in turn (default: raw)
    serve_clients: tuple[str, ...] = ()
    serve_timeout: float = 300.0            # server start-up
    plots: bool = True
    cpu_threads: Optional[int] = None       # torch intra-op threads on CPU (None: torch's default)
    # section adaptive (bench/adaptive.py): the GPU preset fits one H100 in about 7 minutes
    adaptive_target: str = "1.7b"           # dummy target shape (ADAPTIVE_TARGETS)
    adaptive_batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)
    adaptive_ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    adaptive_prompt_len: int = 32
    # tokens per request, at least: at 32, a good draft's cells at batch >= 4 were 5-16 decode
    # steps (H100, 2026-11-26), so one slow step or the first steps' climb decided a cell
    adaptive_output_len: int = 128
    adaptive_cell_tokens: int = 128         # tokens per cell, at least (batch 1 runs 128 steps' worth)
    adaptive_mid_layers: int = 4            # the truncated draft's layers
    adaptive_late_scale: float = 0.05       # the target's later layers' output scale
    adaptive_ramp_requests: int = 256
    adaptive_ramp_output_len: int = 128
    adaptive_ramp_rate: float = 2.0         # arrivals per plain decode step while climbing
    adaptive_exact_widths: bool = True      # fixed k verifies at exactly k + 1 (CUDA graphs)
    adaptive_pairs: tuple[str, ...] = ADAPTIVE_PAIRS
    adaptive_repeats: int = 3               # rounds of every configuration per cell and on the ramp
    adaptive_cell_warmup_tokens: int = 16   # each config's untimed run of a cell's prompts first (0: none)
    adaptive_variants: tuple[str, ...] = () # controller variants run beside adaptive (A/B)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise ValueError(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
        if self.k < 1 or self.k > 16:
            raise ValueError("--k must be between 1 and 16")
        if (self.pair_target is None) != (self.pair_draft is None):
            raise ValueError("give both --pair-target and --pair-draft, or neither (demo pair)")
        if min(self.batch_sizes) < 1 or min(self.serve_concurrency) < 1:
            raise ValueError("batch sizes and concurrencies must be positive")
        if self.adaptive_target not in ADAPTIVE_TARGETS:
            raise ValueError(f"--adaptive-target must be one of {', '.join(ADAPTIVE_TARGETS)}")
        if min(self.adaptive_ks) < 1 or max(self.adaptive_ks) > 16 or min(self.adaptive_batch_sizes) < 1:
            raise ValueError("--adaptive-ks must lie in 1..16 and --adaptive-batch-sizes be positive")
        if not self.adaptive_pairs or set(self.adaptive_pairs) - set(ADAPTIVE_PAIRS):
            raise ValueError(f"--adaptive-pairs must name some of {', '.join(ADAPTIVE_PAIRS)}")
        if set(self.adaptive_variants) - set(ADAPTIVE_VARIANTS):
            raise ValueError(f"--adaptive-variants must name some of {', '.join(ADAPTIVE_VARIANTS)}")
        if set(self.serve_clients) - {"httpx", "raw"}:
            raise ValueError("--serve-clients must name some of httpx, raw")
        if self.adaptive_cell_warmup_tokens < 0:
            raise ValueError("--adaptive-cell-warmup-tokens must be at least 0")
        if self.adaptive_repeats < 1:
            raise ValueError("--adaptive-repeats must be at least 1")
        if self.adaptive_mid_layers < 1 or self.adaptive_ramp_requests < 1 or self.adaptive_ramp_rate <= 0:
            raise ValueError("--adaptive-mid-layers, --adaptive-ramp-requests and the ramp rate must be positive")

    @property
    def load_clients(self) -> tuple[str, ...]:
        """The serve section's clients: as given, else raw."""
        return self.serve_clients or ("raw",)

    def requests_for(self, concurrency: int) -> int:
        if self.serve_requests is not None:
            return self.serve_requests
        return min(128, max(8 if not self.quick else 2, 2 * concurrency))

    def as_dict(self) -> dict:
        return asdict(self)


# --quick: tiny models on CPU, a whole run in well under a minute
QUICK = dict(batch_sizes=(1, 4), prompt_len=16, output_len=16, max_model_len=256, decode_warmup=2,
             decode_steps=8, warmup=1, repeats=3, verify_ks=(2, 4, 8), verify_context=32,
             bandwidth_bytes=32 << 20, bandwidth_repeats=5, peer_repeats=1,
             serve_concurrency=(1, 4), serve_output_len=8, serve_timeout=120.0, cpu_threads=1,
             adaptive_batch_sizes=(1, 4), adaptive_ks=(1, 2, 4), adaptive_prompt_len=8,
             adaptive_output_len=8, adaptive_cell_tokens=16, adaptive_mid_layers=1,
             adaptive_ramp_requests=8, adaptive_ramp_output_len=8, adaptive_ramp_rate=1.0,
             adaptive_repeats=2)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _sections(text: str) -> tuple[str, ...]:
    names = _names(text)
    bad = [n for n in names if n not in SECTIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown sections {bad}; known: {','.join(SECTIONS)}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (bench.json, bench.md, *.png)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--kernel-backend", choices=["auto", "torch", "triton"], default="auto",
                   help="auto: Triton on CUDA, the PyTorch reference on CPU")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--ragged-graph-tokens", type=int, default=None,
                   help="the engines' --ragged-graph-tokens: prefill, mixed and catch-up forwards up to "
                        "this many tokens replay CUDA graphs; 0 runs them eagerly (default 1024)")
    p.add_argument("--quick", action="store_true", help="tiny shapes and counts (CPU smoke run)")
    p.add_argument("--sections", type=_sections, default=DEFAULT_SECTIONS,
                   help=f"comma-separated subset of {','.join(SECTIONS)} (default: all but adaptive)")
    p.add_argument("--seed", type=int, default=None, help="seeds dummy weights and prompts (default 0)")
    p.add_argument("--k", type=int, default=None, help="draft tokens per step (default 4)")
    p.add_argument("--batch-sizes", type=_ints, default=None, help="e2e batch sizes (1,16,64)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per request (default 128)")
    p.add_argument("--output-len", type=int, default=None, help="generated tokens per request (default 128)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context limit of the engines (default 1024; it also sizes the graphs' attention grid)")
    p.add_argument("--decode-steps", type=int, default=None, help="timed batch-1 decode steps")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per forward measurement")
    p.add_argument("--pair-target", default=None, help="target of the real pair (default: demo)")
    p.add_argument("--pair-draft", default=None, help="draft of the real pair (default: demo)")
    p.add_argument("--serve-concurrency", type=_ints, default=None,
                   help="client concurrency levels of the serve section (default 1,16,64)")
    p.add_argument("--serve-requests", type=int, default=None, help="requests per concurrency level")
    p.add_argument("--serve-output-len", type=int, default=None,
                   help="tokens per request in the serve section (default 64)")
    p.add_argument("--serve-no-stream", dest="serve_stream", action="store_const", const=False,
                   default=None, help="the serve section's requests ask for one JSON body, not a "
                                      "stream (throughput and E2E only)")
    p.add_argument("--serve-clients", type=_names, default=None,
                   help="load clients of the serve section, each level run with each in turn: raw "
                        "(the default: one keep-alive connection per concurrent worker over asyncio "
                        "streams, streams and bodies) and httpx (its connection pool; it held some "
                        "requests for seconds before writing them: scripts/httpx_stall_repro.py)")
    p.add_argument("--serve-log-level", choices=("warning", "info", "debug"), default=None,
                   help="the serve section's server log level (default warning; at info its stats "
                        "line lands in serve.log every second)")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads on CPU (--quick: 1; tiny ops on a busy machine run far "
                        "faster single-threaded)")
    p.add_argument("--no-plots", action="store_true", help="write the JSON and Markdown only")
    a = p.add_argument_group("section adaptive (issue 14; run it with --sections adaptive)")
    a.add_argument("--adaptive-target", choices=ADAPTIVE_TARGETS, default=None,
                   help="dummy target shape: Qwen3-1.7B-like (default) or Qwen3-4B-like")
    a.add_argument("--adaptive-batch-sizes", type=_ints, default=None, help="default 1,4,16,64,256")
    a.add_argument("--adaptive-ks", type=_ints, default=None, help="fixed k measured (default 1..8; k_max = the largest)")
    a.add_argument("--adaptive-prompt-len", type=int, default=None, help="default 32")
    a.add_argument("--adaptive-output-len", type=int, default=None, help="tokens per request, at least (default 128: shorter cells of a good draft are a few "
                        "decode steps, where one slow step decides the cell)")
    a.add_argument("--adaptive-cell-tokens", type=int, default=None,
                   help="tokens per cell, at least: small batches run longer requests (default 128)")
    a.add_argument("--adaptive-mid-layers", type=int, default=None,
                   help="layers of the truncated draft copied from the target (default 4)")
    a.add_argument("--adaptive-late-scale", type=float, default=None,
                   help="scale of the target's later layers' output projections (default 0.05)")
    a.add_argument("--adaptive-ramp-requests", type=int, default=None, help="requests of the ramp = its peak batch (256)")
    a.add_argument("--adaptive-ramp-output-len", type=int, default=None, help="tokens per ramp request (128)")
    a.add_argument("--adaptive-ramp-rate", type=float, default=None,
                   help="ramp arrivals per plain decode step while climbing (2)")
    a.add_argument("--no-adaptive-exact-widths", dest="adaptive_exact_widths", action="store_const",
                   const=False, default=None,
                   help="fixed k uses the adaptive engine's padded verification widths")
    a.add_argument("--adaptive-pairs", type=_names, default=None,
                   help=f"comma-separated draft pairs to measure, of {','.join(ADAPTIVE_PAIRS)} "
                        "(default all; the ramp runs with mid)")
    a.add_argument("--adaptive-repeats", type=int, default=None,
                   help="rounds per cell and of the ramp: each runs no-spec, adaptive right after it, "
                        "then every fixed k; the table shows each configuration's median run and the "
                        "medians of the ratios within a round (default 3)")
    a.add_argument("--adaptive-cell-warmup-tokens", type=int, default=None,
                   help="tokens per request of each configuration's untimed run of a cell's own "
                        "prompts before its timed rounds, so first-use costs at a new batch size "
                        "land outside them (default 16; 0: none)")
    a.add_argument("--adaptive-variants", type=_names, default=None,
                   help=f"A/B: controller variants, of {','.join(ADAPTIVE_VARIANTS)}, each run right "
                        "after adaptive in every repeat and on the ramp, with its own estimates and "
                        "cost model (no-optimism: cold acceptance estimates read as they are; aging: "
                        "acceptance outcomes count half after 128 steps)")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Flags over the preset (full, or QUICK with --quick); unknown combinations raise ValueError."""
    base: dict[str, Any] = dict(QUICK) if args.quick else {}
    names = {f.name for f in fields(BenchOptions)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    given["plots"] = not args.no_plots
    return replace(BenchOptions(out=args.out), **{**base, **given})
