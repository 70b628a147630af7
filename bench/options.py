"""``specserve bench`` flags -> :class:`BenchOptions` (full-size defaults, or ``--quick`` ones)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

SECTIONS = ("roofline", "verify", "sampler", "e2e", "peer", "serve")


@dataclass(frozen=True)
class BenchOptions:
    out: str
    device: str = "auto"
    dtype: Optional[str] = None             # None: bfloat16 on CUDA, float32 on CPU
    kernel_backend: str = "auto"
    enforce_eager: bool = False
    quick: bool = False
    sections: tuple[str, ...] = SECTIONS
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
    serve_timeout: float = 300.0            # server start-up
    plots: bool = True
    cpu_threads: Optional[int] = None       # torch intra-op threads on CPU (None: torch's default)

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
             serve_concurrency=(1, 4), serve_output_len=8, serve_timeout=120.0, cpu_threads=1)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
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
    p.add_argument("--quick", action="store_true", help="tiny shapes and counts (CPU smoke run)")
    p.add_argument("--sections", type=_sections, default=SECTIONS,
                   help=f"comma-separated subset of {','.join(SECTIONS)}")
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
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads on CPU (--quick: 1; tiny ops on a busy machine run far "
                        "faster single-threaded)")
    p.add_argument("--no-plots", action="store_true", help="write the JSON and Markdown only")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Flags over the preset (full, or QUICK with --quick); unknown combinations raise ValueError."""
    base: dict[str, Any] = dict(QUICK) if args.quick else {}
    names = {f.name for f in fields(BenchOptions)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    given["plots"] = not args.no_plots
    return replace(BenchOptions(out=args.out), **{**base, **given})
