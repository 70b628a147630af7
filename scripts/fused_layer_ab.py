"""A/B on the GPU: a model's 1-token forward with one of the Triton backend's fusions off and on,
in one process. ``--switch fused-layer`` (default): the decoder layers op by op against one
persistent kernel per layer (kernels/triton_decoder_layer.py). ``--switch decode-attention``:
the attention prologue and attention as two kernels against one (kernels/triton_decode_attention.py).
``--switch norm-one-row``: the fused add + RMSNorm GEMV launches of kernels/triton_gemv.py's
NORM_ONE_ROW (and the 0.6B gate_up fused) against the state before them.
``--switch pdl``: the model's kernels (GEMV, attention, prologue, RMSNorm) launched one after the
other against launched while the kernel before runs (kernels/triton_pdl.py; used only for
models of hidden size up to triton_pdl.MAX_HIDDEN and, above it, for forwards of
triton_pdl.LARGE_MODEL_ROWS token rows, so both arms are the same at other rows of a large model).
With ``fused-layer``, "off" runs the layers op by op with the fused decode attention (the
default since a37617c), so it is not the baseline of the fused-layer runs before that commit.

The model (dummy bf16 weights, Qwen3-0.6B shape) runs embeddings -> 28 layers -> final norm ->
LM head over a random paged KV cache (each row after ``--context`` tokens), captured as a CUDA
graph per (rows, fused off / on) and timed alternately, ``--rounds`` times. Before timing, one
eager forward of each from the same cache: the logits' largest difference and whether the
argmax agrees. Also the model's roofline (weight bytes / copy bandwidth) and what each fused
variant compiled to (registers, programs per SM, grid).

    python scripts/fused_layer_ab.py --out /tmp/fused    (GPU only)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def capture(fn):
    """``fn`` captured as a CUDA graph (bench.timing.capture_graph): its replay."""
    from specserve.bench.timing import capture_graph

    return capture_graph(fn)[0].replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/fused")
    ap.add_argument("--rounds", type=int, default=3, help="off/on alternations")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--replays", type=int, default=50, help="graph replays per timing")
    ap.add_argument("--rows", default="1,2")
    ap.add_argument("--shape", default="QWEN3_06B_LIKE",
                    help="a bench.shapes or bench.adaptive model shape (QWEN3_17B_LIKE: the adaptive bench's target) (TINY_DRAFT with --device cpu: a smoke run "
                         "under TRITON_INTERPRET=1, eager, no graphs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--switch", choices=["fused-layer", "decode-attention", "norm-one-row", "pdl"],
                    default="fused-layer",
                    help="the fusion turned off and on")
    ap.add_argument("--variants", default="",
                    help="extra fused variants at the first row count, comma-separated: "
                         "splits=N (attention splits), warps=N, tile=N (weight elements per tile)")
    ap.add_argument("--norm-shapes", default="",
                    help="with --switch norm-one-row: only these entries of this GPU's NORM_ONE_ROW "
                         "are off in the off arm, as N,K pairs separated by ';' (e.g. 4096,1024: the "
                         "0.6B qkv). Off, a shape in NORM_PROLOGUE_SHAPES stays fused at the plain "
                         "GEMV's launch shape; any other runs the norm kernel and then the GEMV")
    ap.add_argument("--pdl-max-hidden", type=int, default=None,
                    help="the largest hidden size launched with PDL (kernels/triton_pdl.MAX_HIDDEN) "
                         "for this run: measure PDL on a larger model")
    ap.add_argument("--pdl-families", default=None,
                    help="with --switch pdl on a model above triton_pdl.MAX_HIDDEN: the kernel "
                         "families (gemv, attention, norm, prologue; comma-separated) whose "
                         "launches use PDL in the 'on' arm (triton_pdl.LARGE_MODEL_FAMILIES)")
    ap.add_argument("--pdl-rows", default=None,
                    help="the token rows LO-HI (e.g. 2-8) of a forward at which a model above "
                         "triton_pdl.MAX_HIDDEN launches every kernel with PDL "
                         "(triton_pdl.LARGE_MODEL_ROWS), or 'none'; with --pdl-families, 'none' "
                         "measures the families alone")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile both arms' graphs at the first row count kernel by "
                         "kernel (scripts/graph_kernel_profile.py): <switch>_<shape>_profile.md")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    from specserve.bench import adaptive, shapes
    from specserve.bench.engines import weight_bytes
    from specserve.bench.timing import copy_bandwidth
    from specserve.engine.models.llama import AttentionMetadata
    from specserve.engine.models.loader import load_model
    from specserve.engine.models.spec import read_model_spec
    from specserve.kernels import backend, ops, triton_decoder_layer, triton_gemv

    backend.set_backend("triton")
    from specserve.kernels import triton_pdl

    if args.pdl_max_hidden is not None:
        triton_pdl.MAX_HIDDEN = args.pdl_max_hidden
    if args.pdl_families is not None:
        families = frozenset(f for f in args.pdl_families.split(",") if f)
        if not families <= set(triton_pdl.FAMILIES):
            ap.error(f"--pdl-families {args.pdl_families}: each of {', '.join(triton_pdl.FAMILIES)}")
        triton_pdl.LARGE_MODEL_FAMILIES = families
    if args.pdl_rows is not None:
        try:
            lo, hi = (0, 0) if args.pdl_rows == "none" else map(int, args.pdl_rows.split("-"))
        except ValueError:
            ap.error(f"--pdl-rows {args.pdl_rows}: LO-HI (e.g. 2-8) or none")
        triton_pdl.LARGE_MODEL_ROWS = range(lo, hi + 1) if hi else range(0)
    own_norm = triton_gemv.norm_table(torch.device(args.device))   # this GPU's NORM_ONE_ROW
    if args.switch == "norm-one-row" and not own_norm:
        print("note: this device has no NORM_ONE_ROW entry: both arms run the same launches")

    norm_tables = triton_gemv.NORM_ONE_ROW
    dropped = {tuple(int(v) for v in nk.split(",")) for nk in args.norm_shapes.split(";") if nk}
    if dropped and (args.switch != "norm-one-row" or not dropped <= set(own_norm)):
        ap.error(f"--norm-shapes {args.norm_shapes}: needs --switch norm-one-row and shapes of "
                 f"this GPU's NORM_ONE_ROW ({sorted(own_norm)})")
    if args.profile:
        import graph_kernel_profile as gkp   # (scripts/, beside this file)

    def switch(flag: bool) -> None:
        if args.switch == "fused-layer":
            ops.set_fused_layer(flag)
        elif args.switch == "decode-attention":
            ops.set_decode_fusion(flag)
        elif args.switch == "pdl":
            ops.set_pdl(flag)
        else:   # norm-one-row: off is the state before NORM_ONE_ROW (0.6B gate_up unfused)
            triton_gemv.NORM_ONE_ROW = norm_tables if flag else (
                {gpu: {nk: c for nk, c in t.items() if nk not in dropped} for gpu, t in norm_tables.items()}
                if dropped else {})
            triton_gemv.clear_table_cache()

    def restore() -> None:                 # the defaults
        ops.set_fused_layer(False)
        ops.set_decode_fusion(True)
        ops.set_pdl(True)
        triton_gemv.NORM_ONE_ROW = norm_tables
        triton_gemv.clear_table_cache()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    ckpt = shapes.write_checkpoint(os.path.join(tempfile.mkdtemp(), "draft"),
                                   getattr(shapes, args.shape, None) or getattr(adaptive, args.shape))
    spec = read_model_spec(ckpt)
    dtype = torch.bfloat16 if cuda else torch.float32
    model = load_model(spec, dev, dtype, 2048, "dummy", 0)
    block, max_seq = 16, 1024
    rows = [int(r) for r in args.rows.split(",")]
    num_blocks = max(512, max(rows) * -(-(args.context + 1) // block))
    gen = torch.Generator(device=dev).manual_seed(0)
    shape = (num_blocks, block, spec.num_kv_heads, spec.head_dim)
    kv0 = [(torch.randn(shape, device=dev, generator=gen).to(dtype),
            torch.randn(shape, device=dev, generator=gen).to(dtype))
           for _ in range(spec.num_layers)]
    bw = copy_bandwidth(dev, (1 << 30) if cuda else (1 << 24)).bytes_per_s
    roof = weight_bytes(model)["bytes_per_decode_step"] / bw

    def inputs(m: int):
        per = -(-(args.context + 1) // block)
        tables = torch.arange(m * per, dtype=torch.int32, device=dev).view(m, per)
        pos = torch.full((m,), args.context, dtype=torch.int64, device=dev)
        slots = (tables[:, args.context // block].long() * block + args.context % block)
        meta = AttentionMetadata(slots, tables, torch.arange(m + 1, dtype=torch.int32, device=dev),
                                 torch.full((m,), args.context + 1, dtype=torch.int32, device=dev),
                                 1, max_seq)
        ids = torch.randint(0, spec.vocab_size, (m,), device=dev, generator=gen)
        return ids, pos, meta

    def forward(ids, pos, meta, kv):
        x, res = model.run_layers(model.embed_tokens(ids), None, pos, meta, kv, 0, spec.num_layers)
        return model.compute_logits(model.final_norm(x, res))

    lines = [f"# {args.switch} A/B ({args.shape}) on {torch.cuda.get_device_name() if cuda else dev}, {time.strftime('%F %T')}",
             f"copy bandwidth {bw / 1e9:.0f} GB/s; the model's roofline {roof * 1e6:.1f} us per "
             f"1-token step; context {args.context}; CUDA graphs, {args.replays} replays per timing"]
    graphs, keep, results = {}, [], {"bandwidth": bw, "roofline_s": roof, "cells": {}}
    for m in [int(r) for r in args.rows.split(",")]:
        ids, pos, meta = inputs(m)
        with torch.inference_mode():
            logits = {}
            for name, flag in (("off", False), ("on", True)):
                switch(flag)
                kv = [(k.clone(), v.clone()) for k, v in kv0]
                logits[name] = forward(ids, pos, meta, kv).float()
                if not cuda:
                    graphs[(m, name)] = (flag, lambda ids=ids, pos=pos, meta=meta, kv=kv:
                                         forward(ids, pos, meta, kv))
                    continue
                graphs[(m, name)] = (flag, capture(lambda: forward(ids, pos, meta, kv)))
                keep.append((ids, pos, meta, kv))   # a graph reads these addresses at replay
            restore()
        if m == int(args.rows.split(",")[0]) and args.switch == "fused-layer":
            for variant in filter(None, args.variants.split(",")):
                knob, value = variant.split("=")
                saved = (triton_decoder_layer.force_splits, triton_decoder_layer.NUM_WARPS,
                         triton_decoder_layer.TILE_ELEMS)
                setattr(triton_decoder_layer, {"splits": "force_splits", "warps": "NUM_WARPS",
                                               "tile": "TILE_ELEMS"}[knob], int(value))
                triton_decoder_layer._plans.clear()
                ops.set_fused_layer(True)
                kv = [(k.clone(), v.clone()) for k, v in kv0]
                with torch.inference_mode():
                    forward(ids, pos, meta, kv)
                    replay = capture(lambda: forward(ids, pos, meta, kv))
                ops.set_fused_layer(False)
                (triton_decoder_layer.force_splits, triton_decoder_layer.NUM_WARPS,
                 triton_decoder_layer.TILE_ELEMS) = saved
                triton_decoder_layer._plans.clear()
                graphs[(m, variant)] = (True, replay)
                keep.append((ids, pos, meta, kv))
                results["cells"].setdefault(f"{m} {variant}", {"on": [], "off": None})
        diff = (logits["on"] - logits["off"]).abs().max().item()
        same = bool((logits["on"].argmax(-1) == logits["off"].argmax(-1)).all())
        lines.append(f"rows={m}: logits max |on - off| = {diff:.4g} (largest |logit| "
                     f"{logits['off'].abs().max().item():.3g}); same argmax: {same}")
        results["cells"][m] = {"logit_diff": diff, "same_argmax": same, "off": [], "on": []}
        print(lines[-1], flush=True)
    for info in triton_decoder_layer.launch_info.values():
        lines.append(f"compiled: {info}")
    for _ in range(args.rounds):
        for (m, name), (flag, run) in graphs.items():
            switch(flag)                   # (only the eager smoke run reads it here)
            run()
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.replays):
                run()
            if cuda:
                torch.cuda.synchronize()
            cell = results["cells"][m] if name in ("on", "off") else results["cells"][f"{m} {name}"]
            cell["on" if name != "off" else "off"].append((time.perf_counter() - t0) / args.replays)
        restore()
    lines += ["", "| rows | off (us) | on (us) | off / on | on / roofline |",
              "|---|---|---|---|---|"]
    for m, c in results["cells"].items():
        if c["off"] is None:       # a variant: against its row count's op-by-op time
            c = {**c, "off": results["cells"][int(str(m).split()[0])]["off"]}
        off, on = statistics.median(c["off"]), statistics.median(c["on"])
        lines.append(f"| {m} | {off * 1e6:.1f} ({', '.join(f'{x * 1e6:.0f}' for x in c['off'])}) | "
                     f"{on * 1e6:.1f} ({', '.join(f'{x * 1e6:.0f}' for x in c['on'])}) | "
                     f"{off / on:.2f}x | {on / roof:.2f}x |")
    text = "\n".join(lines)
    print(text)
    stem = f"{args.switch}_{args.shape}"
    with open(os.path.join(args.out, f"{stem}_ab.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, f"{stem}_ab.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    if args.profile and cuda:
        first = rows[0]
        parts, data = [f"# kernel profile: {args.shape}, {first} row(s), --switch {args.switch}"], {}
        for name in ("off", "on"):
            flag, run = graphs[(first, name)]
            switch(flag)
            data[name] = gkp.profile_replays(run)
            parts.append(gkp.report(f"{args.switch} {name}", data[name]))
        restore()
        text = "\n\n".join(parts)
        print(text)
        with open(os.path.join(args.out, f"{stem}_profile.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, f"{stem}_profile.json"), "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
