"""The prefill form of sparse attention at 8,192 queries of the release's shapes: pipeline
depth (num_stages), key tile, the two-pass form and one bf16 part, against the shipped tiles
(PREFILL_TILES), alternated, each with its FLOP rate (the bf16 limit is 694 TFLOP/s), and
its largest difference from the exact form and from faithful mode's shipped one-part form.
With --bf16-queries every variant takes faithful mode's bf16 queries, as the model passes
them, GLUON=0/1 switches between the Triton form and sparse_attention_gluon, and
GLUON_GATHER=0 has the latter read the keys in place (no gather_keys copies), and GLUON_SKIP
leaves phases of its step out (an ablation: sparse_attention_gluon's SKIP); the decoded form
(attend_decoded: keys decoded once, read as bf16 rows; the Gluon form for bf16 queries, the
two-pass form for fp32 ones) is timed beside them, and --whole-variants "DECODED=0;DECODED=1"
A/Bs it in whole prefills (--whole-exact: in exact mode).

    python bench/prefill_attention_stages.py [--variants "BOTH=1,num_warps=8,KT=64;TWO_PASS=0"]
    python bench/prefill_attention_stages.py --bf16-queries --variants "GLUON=0;GLUON=1;GLUON=1,GLUON_GATHER=0"
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import sparse_attention as sa  # noqa: E402
from dsflash.model.kernels.sparse_attention import sparse_attention  # noqa: E402

dev = "cuda"
heads, D, W, K, n = 64, 512, 128, 512, 8192
rows = 1 << 16
ring, pages = h200.key_bytes(rows, D, dev)
q = torch.randn(n, heads, D, device=dev)
# neighbouring queries share their window (as in a prompt) and draw entries from a nearby range
base = torch.arange(n, device=dev)[:, None]
w_off = ((base + torch.arange(W, device=dev)[None, :]) % rows) * D
w_soff = rows * D + ((base + torch.arange(W, device=dev)[None, :]) % rows) * (D // 32)
pick = torch.randint(0, 4096, (n, K), device=dev)
e_off, e_soff = pick * 256, rows * 256 + pick * 32
sink = torch.zeros(heads, device=dev)
args = (q, ring, w_off, w_soff, pages, e_off, e_soff, sink, D**-0.5)
ref = sparse_attention(*args, prefill=True)
flops = 4 * n * heads * (W + K) * D


def timed(tiles, query):
    call = (query,) + args[1:]
    seconds = h200.cuda_time(lambda: sparse_attention(*call, prefill=True, tiles=tiles), iters=5, warmup=2)
    out = sparse_attention(*call, prefill=True, tiles=tiles)
    return seconds * 1e3, [((out - r).abs().max() / r.abs().max()).item() for r in (ref, faithful_ref)]


# Exact mode's shipped form is two-pass (the logits once per query, then the weighted sums;
# eighth session). Faithful mode's bf16 queries take the one-pass form in one part, as one
# program for both column halves (BF16_PREFILL_TILES, sixteenth session); its variants here
# are its key tile and pipeline depth, and the parity programs it replaced. (fp32 queries in
# one part attend as their bf16 values do.)
FAITHFUL = "TWO_PASS=0,QP=1,PP=1"
SHIPPED_FAITHFUL = FAITHFUL + "".join(f",{k}={v}" for k, v in sa.BF16_PREFILL_TILES.items())
DEFAULT = ";".join(["", SHIPPED_FAITHFUL, f"{FAITHFUL},BOTH=0,KT=32,num_warps=4"]
                   + [f"{SHIPPED_FAITHFUL},{v}" for v in ("KT=32", "num_stages=3", "num_stages=1")])
parser = argparse.ArgumentParser()
parser.add_argument("--variants", default=DEFAULT, help="';'-separated tiles of KEY=VALUE pairs ('' is shipped)")
parser.add_argument("--bf16-queries", action="store_true",
                    help="every variant takes faithful mode's bf16 queries (the Gluon form takes only those)")
parser.add_argument("--whole", type=int, default=0,
                    help="then whole faithful prefills of this many tokens on the bench preset, --whole-variants in"
                         " turn in one process (lent machines differ by more than the change)")
parser.add_argument("--whole-variants", default="GLUON=0;GLUON=1",
                    help="';'-separated tiles the whole prefills take in turn (over BF16_PREFILL_TILES, or with"
                         " --whole-exact over PREFILL_TILES)")
parser.add_argument("--whole-exact", action="store_true", help="the whole prefills in exact mode (not faithful)")
parser.add_argument("--decoded-skips", default="",
                    help="with --bf16-queries, the decoded Gluon form's ablations timed too (its SKIP values, e.g."
                         " 2,4,8,16,10,14)")
parser.add_argument("--chunk", type=int, default=16384, help="the whole prefills' chunk (token budget)")
parser.add_argument("--budget-s", type=float, default=300.0)
options = parser.parse_args()
faithful_ref = sparse_attention(q.bfloat16(), *args[1:], prefill=True)  # the faithful launch as shipped
variants = h200.variants(options.variants)
query = q.bfloat16() if options.bf16_queries else q
for round_ in range(2):
    for v in variants:
        try:
            ms, (diff, faithful_diff) = timed(v, query)
            print(f"[attn] round {round_} {v or 'shipped'}: {ms:.2f} ms ({flops / ms / 1e9:.0f} TFLOP/s), max rel diff"
                  f" {diff:.1e} (to faithful shipped {faithful_diff:.1e})", flush=True)
        except Exception as exc:
            print(f"[attn] {v}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)

# the decoded form: the keys decoded once (timed with it), then read as bf16 rows
every = torch.arange(rows, device=dev)
shipped = faithful_ref if options.bf16_queries else ref


def decoded():
    window_keys = sa.decode_keys(ring, every * D, rows * D + every * (D // 32), D, fp4=False)
    entry_keys = sa.decode_keys(pages, every * 256, rows * 256 + every * 32, D, fp4=True)
    return sa.attend_decoded(query, window_keys, torch.where(w_off >= 0, w_off // D, -1), entry_keys, pick,
                             sink, D**-0.5)


for round_ in range(2):
    for skip in [0] + ([int(x) for x in options.decoded_skips.split(",") if x] if options.bf16_queries else []):
        sa.BF16_PREFILL_TILES["GLUON_SKIP"] = skip  # the Gluon form's ablation (bf16 queries)
        ms = h200.cuda_time(decoded, iters=5, warmup=2) * 1e3
        diff = ((decoded() - shipped).abs().max() / shipped.abs().max()).item()
        print(f"[attn] round {round_} decoded{f' SKIP={skip}' if skip else ''} (keys decoded once, {2 * rows} "
              f"keys, timed with it): {ms:.2f} ms ({flops / ms / 1e9:.0f} TFLOP/s), max rel diff to the shipped "
              f"byte form {diff:.1e}", flush=True)
    sa.BF16_PREFILL_TILES.pop("GLUON_SKIP", None)

if options.whole:
    import time

    h200.DEADLINE[0] = time.monotonic() + options.budget_s
    del q, args, ref, faithful_ref, query, ring, pages, shipped
    torch.cuda.empty_cache()
    model, _ = h200.build_model(fast=True, preset="bench", act_quant=not options.whole_exact)
    h200.hold_experts_once(model)  # as a worker holds them (a prefill with both forms ran out of 80 GB)
    tiles = sa.PREFILL_TILES if options.whole_exact else sa.BF16_PREFILL_TILES
    mode = "exact" if options.whole_exact else "faithful"
    shipped_tiles = dict(tiles)
    for round_ in range(3):  # round 0 compiles every variant's kernels (its figures include that)
        for v in h200.variants(options.whole_variants):
            tiles.update(v)
            name = "_".join(f"{k}{x}" for k, x in v.items()) or "shipped"
            h200.prefill(model, [options.whole], f"whole_{mode}_{name}_round{round_}", warm_first=round_ == 0,
                         chunk=options.chunk)
            tiles.clear()
            tiles.update(shipped_tiles)
