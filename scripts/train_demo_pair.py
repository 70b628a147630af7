"""Train the embedded demo pair: a small Llama-style target and a much smaller draft.

Reproducible (seeded; corpus, steps and tokens recorded in ``metrics.json``). Steps:

1. corpus: the installed Python sources (``demo_corpus.collect``), seeded split into train/held-out;
2. one byte-level BPE tokenizer for both models (``demo_data``);
3. target: next-token cross-entropy on the stream, then saved (bf16) at once;
4. draft: distilled from the saved bf16 target (forward KL(p || q) mixed with cross-entropy),
   which directly raises alpha = sum min(p, q); saved (bf16);
5. evaluation (wrapped, after saving): held-out loss, greedy agreement, alpha(T) with and without
   draft probabilities, on held-out files and on ``tests/data/heldout_snippet.py``; model card.

Example (the GPU run)::

    python scripts/train_demo_pair.py --out $OUT/demo --device cuda \
        --target-seconds 170 --draft-seconds 100

Toy run on CPU: ``--device cpu --corpus-mb 2 --target-steps 20 --draft-steps 10 --batch-size 4
--seq-len 128``. Passing ``--target-steps/--draft-steps`` (as recorded in metrics.json) replays a
time-budgeted run with the same schedule.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_card  # noqa: E402
import demo_corpus  # noqa: E402
import demo_data  # noqa: E402
import demo_eval  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SNIPPET = REPO / "tests" / "data" / "heldout_snippet.py"
_T0 = time.monotonic()
_LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.monotonic() - _T0:7.1f}s] {msg}"
    _LOG.append(line)
    print(line, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="writes target/, draft/, metrics.json, ...")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus-mb", type=float, default=160.0, help="training text, MB")
    ap.add_argument("--heldout-mb", type=float, default=1.0, help="held-out files, MB")
    ap.add_argument("--tokenizer-sample-mb", type=float, default=24.0)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--chat-fraction", type=float, default=0.05)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=128, help="sequences per step")
    ap.add_argument("--target", default="hidden=256,layers=8,heads=4,kv_heads=2,ff=576")
    ap.add_argument("--draft", default="hidden=128,layers=3,heads=2,kv_heads=2,ff=384")
    ap.add_argument("--target-steps", type=int, default=0, help="0: as many as --target-seconds allow")
    ap.add_argument("--target-seconds", type=float, default=170.0)
    ap.add_argument("--draft-steps", type=int, default=0, help="0: as many as --draft-seconds allow")
    ap.add_argument("--draft-seconds", type=float, default=100.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--kd-weight", type=float, default=0.8, help="draft loss = w*KL(p||q) + (1-w)*CE")
    ap.add_argument("--size-budget-mb", type=float, default=16.0, help="both directories, 1e6 bytes")
    ap.add_argument("--eval-window", type=int, default=1024)
    ap.add_argument("--deadline-seconds", type=float, default=0.0,
                    help="if > 0, shrink both training budgets so the whole run ends by then")
    return ap.parse_args(argv)


def parse_arch(text: str) -> dict[str, int]:
    out = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    missing = {"hidden", "layers", "heads", "kv_heads", "ff"} - set(out)
    if missing:
        raise SystemExit(f"architecture {text!r} lacks {sorted(missing)}")
    return out


def model_config(arch: dict[str, int], vocab: int, eos_id: int):
    """A LlamaConfig with tied embeddings, bf16 storage and a 2048-token context."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=arch["hidden"], intermediate_size=arch["ff"],
                      num_hidden_layers=arch["layers"], num_attention_heads=arch["heads"],
                      num_key_value_heads=arch["kv_heads"], max_position_embeddings=2048,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                      bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                      attention_bias=False, mlp_bias=False)
    cfg.dtype = torch.bfloat16
    return cfg


def num_params(cfg) -> int:
    """Parameters of a tied-embedding Llama built from ``cfg`` (no model is built)."""
    d, ff, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = d // cfg.num_attention_heads
    attn = d * d * 2 + 2 * d * cfg.num_key_value_heads * hd
    per_layer = attn + 3 * d * ff + 2 * d
    return v * d + cfg.num_hidden_layers * per_layer + d


def lr_at(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warm-up, then cosine from base to base/10 at ``total``."""
    if step < warmup:
        return base * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


class Batches:
    """Seeded random windows of ``seq_len + 1`` tokens from a token stream kept on the device."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch: int, seed: int, device: torch.device):
        self.data = torch.from_numpy(stream.astype(np.int32)).to(device)   # [num_tokens]
        self.seq_len, self.batch, self.device = seq_len, batch, device
        self.gen = torch.Generator().manual_seed(seed)
        self.arange = torch.arange(seq_len + 1, device=device)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        hi = self.data.numel() - self.seq_len - 1
        starts = torch.randint(0, hi, (self.batch,), generator=self.gen).to(self.device)
        win = self.data[starts[:, None] + self.arange].long()   # [batch, seq_len + 1]
        return win[:, :-1], win[:, 1:]


def make_optimizer(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=device.type == "cuda")


def train_loop(name: str, model: torch.nn.Module, loss_fn, batches: Batches, args,
               steps: int, seconds: float) -> dict:
    """Run the optimizer; with ``steps == 0`` the step count is fixed from the measured step time."""
    device = batches.device
    opt = make_optimizer(model, args.lr, device)
    total = steps if steps > 0 else 10**9
    warm, probe, t_start, t_probe = 5, 25, time.monotonic(), None
    step, losses = 0, []
    model.train()
    while step < total:
        if steps == 0 and step == warm:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_probe = time.monotonic()
        if steps == 0 and step == probe:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.monotonic() - t_probe) / (probe - warm)
            total = max(probe + 1, int((seconds - (time.monotonic() - t_start)) / per_step) + probe)
            log(f"{name}: {per_step * 1000:.1f} ms/step -> {total} steps for {seconds:.0f}s")
        if steps == 0 and step > probe and time.monotonic() - t_start > 1.25 * seconds:
            log(f"{name}: stopped at step {step} of {total}, 25% over its time budget")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args.lr, args.warmup)
        x, y = batches.next()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = loss_fn(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == total or step <= 3:
            losses.append((step, float(loss.item())))
            log(f"{name} step {step}/{total} loss {losses[-1][1]:.4f} lr {opt.param_groups[0]['lr']:.2e}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.monotonic() - t_start
    tokens = step * batches.batch * batches.seq_len
    mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    log(f"{name}: {step} steps, {tokens / 1e6:.1f}M tokens in {elapsed:.0f}s (peak GPU memory {mem:.1f} GiB)")
    return {"steps": step, "tokens_seen": tokens, "seconds": elapsed, "loss_curve": losses,
            "final_train_loss": losses[-1][1] if losses else None}


def ce_loss(model, x, y):
    logits = model(input_ids=x).logits                           # [batch, seq, vocab]
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def kd_loss_fn(teacher: torch.nn.Module, weight: float):
    """Draft loss: weight * KL(p_target || q_draft) + (1 - weight) * CE, at temperature 1."""

    def loss(model, x, y):
        with torch.no_grad():
            p_logits = teacher(input_ids=x).logits.float()       # [batch, seq, vocab]
            log_p = torch.log_softmax(p_logits, dim=-1)
        log_q = torch.log_softmax(model(input_ids=x).logits.float(), dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        ce = F.nll_loss(log_q.flatten(0, 1), y.flatten())
        return weight * kl + (1.0 - weight) * ce

    return loss


def save_model(model: torch.nn.Module, tokenizer, out_dir: Path, eos_ids: list[int]) -> int:
    """Write an HF directory in bf16 with tokenizer and generation config; return its bytes."""
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(bos_token_id=eos_ids[0], eos_token_id=eos_ids, pad_token_id=eos_ids[0],
                     do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=256,
                     ).save_pretrained(out_dir)
    _normalise_files(out_dir)
    return sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())


def _normalise_files(out_dir: Path) -> None:
    """config.json names torch_dtype and rope_theta too; the chat template lives in
    tokenizer_config.json, whose tokenizer class and special-token list older readers understand."""
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg.setdefault("dtype", "bfloat16")
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tc_path = out_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    jinja = out_dir / "chat_template.jinja"
    tc["chat_template"] = jinja.read_text() if jinja.exists() else demo_data.CHAT_TEMPLATE
    jinja.unlink(missing_ok=True)
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"   # a name transformers 4.x and 5.x both know
    if isinstance(tc.get("extra_special_tokens"), list):
        tc["additional_special_tokens"] = tc.pop("extra_special_tokens")
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def hardware(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "platform": platform.platform()}
    import transformers
    import tokenizers
    info.update(transformers=transformers.__version__, tokenizers=tokenizers.__version__)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def build_corpus(args) -> tuple:
    """Collect the corpus, train the tokenizer, encode the train and held-out streams."""
    corpus = demo_corpus.collect(int(args.corpus_mb * 1e6), int(args.heldout_mb * 1e6),
                                 args.seed, exclude=REPO)
    train_mb = sum(len(f.text.encode()) for f in corpus.train) / 1e6
    log(f"corpus: {len(corpus.train)} train files ({train_mb:.1f} MB), {len(corpus.heldout)} held out, "
        f"{len(corpus.licences)} sources, from {corpus.roots}")
    sample, size = [], 0
    for f in corpus.train:
        if size >= args.tokenizer_sample_mb * 1e6:
            break
        sample.append(f.text)
        size += len(f.text)
    tok = demo_data.train_tokenizer(sample, args.vocab_size)
    log(f"tokenizer: vocab {tok.get_vocab_size()} trained on {size / 1e6:.1f} MB")
    train_docs = demo_data.documents(corpus.train, args.chat_fraction, args.seed)
    train_ids = demo_data.encode_stream(tok, train_docs)
    held_ids = demo_data.encode_stream(tok, [f.text for f in corpus.heldout])
    log(f"tokens: train {train_ids.size / 1e6:.1f}M ({train_mb * 1e6 / train_ids.size:.2f} bytes/token), "
        f"held-out {held_ids.size / 1e3:.0f}k")
    info = {"train_files": len(corpus.train), "heldout_files": len(corpus.heldout),
            "train_bytes": int(train_mb * 1e6),
            "heldout_bytes": sum(len(f.text.encode()) for f in corpus.heldout),
            "train_tokens": int(train_ids.size), "heldout_tokens": int(held_ids.size),
            "candidate_files": corpus.num_candidates, "roots": corpus.roots,
            "bytes_by_source": corpus.bytes_by_dist("train"), "licences": corpus.licences,
            "heldout_examples": sorted(str(f.path) for f in corpus.heldout)[:20],
            "tokenizer_sample_bytes": size, "chat_fraction": args.chat_fraction}
    return tok, train_ids, held_ids, info


def check_budget(cfgs: dict, args, tok_bytes: int) -> dict:
    sizes = {k: num_params(c) for k, c in cfgs.items()}
    est = 2 * sum(sizes.values()) + 2 * tok_bytes + 20_000
    log(f"params: target {sizes['target'] / 1e6:.2f}M, draft {sizes['draft'] / 1e6:.2f}M; "
        f"estimated size {est / 1e6:.2f} MB of {args.size_budget_mb} MB")
    if est > args.size_budget_mb * 1e6:
        raise SystemExit("the pair would not fit the size budget; choose smaller models")
    return sizes


def fit_deadline(args, reserve: float = 75.0) -> None:
    """Scale the time budgets down when data preparation left less time than planned."""
    if args.deadline_seconds <= 0 or args.target_steps or args.draft_steps:
        return
    left = args.deadline_seconds - (time.monotonic() - _T0) - reserve
    planned = args.target_seconds + args.draft_seconds
    if left < planned:
        scale = min(1.0, max(left, 30.0) / planned)
        args.target_seconds *= scale
        args.draft_seconds *= scale
        log(f"deadline: training budgets scaled by {scale:.2f} to "
            f"{args.target_seconds:.0f}s + {args.draft_seconds:.0f}s")


def write_metrics(args, metrics: dict) -> None:
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (args.out / "train_log.txt").write_text("\n".join(_LOG) + "\n")


def train_pair(args, cfgs: dict, hf_tok, train_ids: np.ndarray, eos_ids: list[int],
               device: torch.device, metrics: dict) -> None:
    """Train and save the target, then distil and save the draft (each saved as soon as done)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    target = LlamaForCausalLM(cfgs["target"]).to(device=device, dtype=torch.float32)
    batches = Batches(train_ids, args.seq_len, args.batch_size, args.seed, device)
    metrics["target_training"] = train_loop("target", target, ce_loss, batches, args,
                                            args.target_steps, args.target_seconds)
    metrics["sizes_bytes"] = {"target": save_model(target, hf_tok, args.out / "target", eos_ids)}
    write_metrics(args, metrics)
    target.eval().requires_grad_(False)   # now bf16: the draft learns from the shipped weights
    torch.manual_seed(args.seed + 1)
    draft = LlamaForCausalLM(cfgs["draft"]).to(device=device, dtype=torch.float32)
    batches = Batches(train_ids, args.seq_len, args.batch_size, args.seed + 1, device)
    metrics["draft_training"] = train_loop("draft", draft, kd_loss_fn(target, args.kd_weight),
                                           batches, args, args.draft_steps, args.draft_seconds)
    metrics["sizes_bytes"]["draft"] = save_model(draft, hf_tok, args.out / "draft", eos_ids)
    metrics["sizes_bytes"]["total"] = metrics["sizes_bytes"]["target"] + metrics["sizes_bytes"]["draft"]
    log(f"saved: {metrics['sizes_bytes']}")
    write_metrics(args, metrics)
    del target, draft


def evaluate(args, tok, held_ids: np.ndarray, device: torch.device, metrics: dict) -> None:
    """Reload the saved (bf16) pair in fp32 and measure it on the held-out files and the snippet."""
    from transformers import AutoModelForCausalLM

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    load = lambda d: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        args.out / d, dtype=torch.float32).to(device).eval()
    target, draft = load("target"), load("draft")
    metrics["heldout"] = demo_eval.pair_metrics(
        target, draft, torch.from_numpy(held_ids.astype(np.int64)), window=args.eval_window)
    log(f"held-out: {json.dumps({k: metrics['heldout'][k] for k in ('target_loss', 'draft_loss', 'greedy_agreement')})}"
        f" alpha {metrics['heldout']['alpha']}")
    if SNIPPET.exists():
        ids = torch.tensor(tok.encode(SNIPPET.read_text(encoding="utf-8"), add_special_tokens=False).ids)
        metrics["snippet"] = demo_eval.pair_metrics(target, draft, ids, window=args.eval_window)
        metrics["snippet"]["path"] = str(SNIPPET.relative_to(REPO))
        log(f"snippet: greedy {metrics['snippet']['greedy_agreement']:.3f} "
            f"alpha(T=1) {metrics['snippet']['alpha']['1']:.3f}")
    metrics["samples"] = samples(target, tok, device)


# prompts end mid-line: a prompt ending in "\n" splits the "\n    " indentation tokens the model
# learned (no token healing), which derails a model this small
SAMPLE_PROMPTS = ("def fibonacci(n):", "import os\n\n\nclass Config",
                  "<|user|>\nWrite the Python module utils.<|end|>\n<|assistant|>\n")


@torch.no_grad()
def samples(model, tok, device: torch.device, max_new: int = 96) -> dict[str, str]:
    """Greedy continuations of a few fixed prompts (shown in the model card)."""
    out = {}
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device=device)
        gen = model.generate(input_ids=ids, max_new_tokens=max_new, do_sample=False)
        out[prompt] = tok.decode(gen[0, ids.shape[1]:].tolist(), skip_special_tokens=False)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed_all(args.seed)
    device = pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"command": "python scripts/train_demo_pair.py " + " ".join(sys.argv[1:] if argv is None else argv),
                     "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     "hardware": hardware(device)}
    log(f"hardware: {metrics['hardware']}")
    tok, train_ids, held_ids, metrics["corpus"] = build_corpus(args)
    hf_tok = demo_data.to_hf_tokenizer(tok)
    eos_ids = [tok.token_to_id(demo_data.EOS), tok.token_to_id(demo_data.END)]
    vocab = tok.get_vocab_size()
    cfgs = {name: model_config(parse_arch(spec), vocab, eos_ids[0])
            for name, spec in (("target", args.target), ("draft", args.draft))}
    metrics["params"] = check_budget(cfgs, args, len(tok.to_str(pretty=True)))
    metrics["architecture"] = {k: parse_arch(v) | {"vocab": vocab} for k, v in
                               (("target", args.target), ("draft", args.draft))}
    fit_deadline(args)
    metrics["args"].update(target_seconds=args.target_seconds, draft_seconds=args.draft_seconds)
    write_metrics(args, metrics)
    train_pair(args, cfgs, hf_tok, train_ids, eos_ids, device, metrics)
    try:
        evaluate(args, tok, held_ids, device, metrics)
    except Exception:  # the weights are saved; report the failure and keep what we have
        metrics["evaluation_error"] = traceback.format_exc()
        log(f"evaluation failed:\n{metrics['evaluation_error']}")
    metrics["total_seconds"] = time.monotonic() - _T0
    write_metrics(args, metrics)
    try:
        (args.out / "MODEL_CARD.md").write_text(demo_card.render(metrics))
    except Exception:
        log(f"model card failed:\n{traceback.format_exc()}")
        write_metrics(args, metrics)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
