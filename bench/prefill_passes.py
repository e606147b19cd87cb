"""A prefill chunk's passes over its big activations, before and after the fifteenth session
fused them, at the bench preset's shapes (8,192 rows; 64 heads of 512; mHC 4 x 5,120):

- the attention's queries: RoPE over all 512 channels, the cast to bf16 (faithful mode) and
  the prefill form's bf16 parts with their columns regrouped, against one pass
  (attention_queries.query_parts);
- the attention output's inverse RoPE: all channels into a new tensor, against in place on
  the 64 rotated ones;
- an mHC site's mixes: RMSNorm of the flattened streams, then torch's fp32 GEMM, against one
  pass that projects and scales (hc_streams.hc_mixes), its dots in each form (FORMS: the
  shipped raw heads, common.RAW_HEADS);
- (sites) a prefill mHC site's launches (the attention site's mixes, gates and input; the
  FFN site's with the attention's expand before them) against one pass over its streams
  (hc_streams.hc_site, SITE_ROWS), in a few tiles; and the pass writing its input's FP8
  operand (SITE_OPERAND) against the pass and then the operand's own encode;
- (bf16, not by default) the one-pass site on bf16 streams, its dots in TF32 passes or
  as bf16 MMAs against fn's bf16 parts (hc_streams.BF16_DOTS), against fp32 streams; and the
  FFN site's expand in a launch of its own before it (hc_streams.SPLIT_EXPAND).

Each figure next to the time its bytes take at the measured 4.2 TB/s HBM read. With
--whole N, whole prefills of N tokens on the bench preset too, the three fusions off and on
in turn in one process (lent machines differ by more than the change), exact mode or
(--act-quant) faithful (h200.prefill: each next to its bf16 FLOP roofline).

    python bench/prefill_passes.py [--rows 8192] [--sections queries,rope,mixes,sites]
                                   [--whole 32768 [--act-quant] --rounds 2 --budget-s 400]
"""
import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import attention_queries, common, hc_streams  # noqa: E402
from dsflash.model.kernels import rope as rope_kernel  # noqa: E402
from dsflash.model.kernels import rms_norm as norm_kernel  # noqa: E402
from dsflash.model.kernels.attention_queries import Queries, query_parts  # noqa: E402
from dsflash.model.kernels.common import bf16_parts  # noqa: E402
from dsflash.model.kernels.rope import rope  # noqa: E402

HEADS, DIM, HALF, STREAMS, HIDDEN, MIXES = 64, 512, 32, 4, 5120, 24
# The mixes' fp32-accurate dots (hc_streams._project): the shipped raw heads, common.dot_fp32's
# masked heads, Triton's tf32x3.
FORMS = {"raw_heads": dict(RAW_HEADS=True), "tf32_heads": dict(RAW_HEADS=False, TF32_HEADS=True),
         "tf32x3": dict(RAW_HEADS=False, TF32_HEADS=False)}


def report(key: str, seconds: float, nbytes: float, **extra) -> None:
    h200.record("passes", key, {"us": seconds * 1e6, "GB": nbytes / 1e9,
                                "ratio_to_hbm": seconds / (nbytes / h200.HBM_BPS), **extra})


def queries(rows: int) -> None:
    q = torch.randn(rows, HEADS, DIM, device="cuda")
    angles = torch.rand(rows, HALF, device="cuda") * 1000
    cos, sin = angles.cos(), angles.sin()
    size = q.numel()
    for bf16, splits in ((True, 1), (False, 2)):
        mode = "faithful" if bf16 else "exact"

        def before():
            rotated = rope(q, cos, sin)
            return bf16_parts(rotated.to(torch.bfloat16) if bf16 else rotated, splits, interleave=2)

        after = lambda: query_parts(Queries(q, cos, sin, bf16), splits, 2)  # noqa: E731
        same = torch.equal(before(), after())
        written = 2 * splits * size
        report(f"queries_{mode}_before", h200.cuda_time(before, iters=10),
               8 * size + (6 * size if bf16 else 0) + (2 * size if bf16 else 4 * size) + written)
        report(f"queries_{mode}_one_pass", h200.cuda_time(after, iters=10), 4 * size + written, bit_equal=same)


def output_rope(rows: int) -> None:
    o = torch.randn(rows, HEADS, DIM, device="cuda")
    angles = torch.rand(rows, HALF, device="cuda") * 1000
    cos, sin = angles.cos(), angles.sin()
    want = rope(o, cos, sin, inverse=True)
    work = o.clone()
    same = torch.equal(rope(work, cos, sin, inverse=True, overwrite=True), want)
    report("output_rope_new_tensor", h200.cuda_time(lambda: rope(o, cos, sin, inverse=True), iters=10), 8 * o.numel())
    rotated_bytes = 8 * o.numel() * 2 * HALF / DIM
    report("output_rope_in_place", h200.cuda_time(lambda: rope(work, cos, sin, inverse=True, overwrite=True),
                                                  iters=10), rotated_bytes, bit_equal=same)


def mixes(rows: int) -> None:
    X = torch.randn(rows, STREAMS, HIDDEN, device="cuda")
    fn = torch.randn(MIXES, STREAMS * HIDDEN, device="cuda") / (STREAMS * HIDDEN) ** 0.5
    before = lambda: norm_kernel.rms_norm(X.flatten(-2), None, 1e-6) @ fn.T  # noqa: E731
    after = lambda: hc_streams.hc_mixes(X, fn, 1e-6)  # noqa: E731
    want, got = before(), after()
    size = 4 * X.numel()
    report("mixes_norm_then_gemm", h200.cuda_time(before, iters=10), 3 * size)
    report("mixes_one_pass", h200.cuda_time(after, iters=10), size,
           max_rel_diff=((got - want).abs().max() / want.abs().max()).item())
    exact = (norm_kernel.rms_norm(X.flatten(-2), None, 1e-6).double() @ fn.double().T).float()
    for form, dots in FORMS.items():
        run = lambda: hc_streams.hc_mixes(X, fn, 1e-6, dots)  # noqa: E731
        report(f"mixes_one_pass_{form}", h200.cuda_time(run, iters=10), size,
               max_rel_diff_fp64=((run() - exact).abs().max() / exact.abs().max()).item())
    for block_t, block_k, warps, stages, splits in ((128, 64, 8, 3, 4), (64, 32, 4, 4, 4), (128, 32, 8, 4, 2),
                                                    (128, 32, 8, 3, 8), (256, 32, 8, 3, 4)):
        tiles = dict(BLOCK_T=block_t, BLOCK_K=block_k, num_warps=warps, num_stages=stages, SPLITS=splits)
        try:
            report(f"mixes_one_pass_T{block_t}_K{block_k}_w{warps}_s{stages}_split{splits}",
                   h200.cuda_time(lambda: hc_streams.hc_mixes(X, fn, 1e-6, tiles), iters=10), size)
        except Exception as exc:  # a shape that needs more shared memory than an SM has
            h200.record("passes", f"mixes_T{block_t}_K{block_k}", {"error": f"{type(exc).__name__}"})


def sites(rows: int) -> None:
    """An mHC site's launches at prefill rows against one pass over its streams: the attention
    site (hc_mixes, hc_gates, hc_collapse_norm: the streams read twice) and the FFN site with
    the attention's expand before it (hc_expand, then the same: three reads and a write),
    against hc_site and hc_gates (one read, and the write). Bytes: the streams read and
    written, the sublayer's output read, the input written (and in one pass read back and
    written again by its RMSNorm)."""
    from dsflash.model.kernels.hc_gates import hc_gates

    X = torch.randn(rows, STREAMS, HIDDEN, device="cuda")
    y = torch.randn(rows, HIDDEN, device="cuda")
    post, pre = torch.rand(rows, STREAMS, device="cuda") * 2, torch.rand(rows, STREAMS, device="cuda")
    comb = torch.softmax(torch.randn(rows, STREAMS, STREAMS, device="cuda"), -1)
    fn = torch.randn(MIXES, STREAMS * HIDDEN, device="cuda") / (STREAMS * HIDDEN) ** 0.5
    base, scale = torch.randn(MIXES, device="cuda"), torch.rand(3, device="cuda") + 0.5
    weight = torch.rand(HIDDEN, device="cuda") + 0.5
    streams, row = 4 * X.numel(), 4 * y.numel()

    def apart(expand: bool, dots: dict | None = None):
        Z = hc_streams.hc_expand(y, X, post, comb) if expand else X
        gates = hc_gates(hc_streams.hc_mixes(Z, fn, 1e-6, dots), base, scale, 20, 1e-6)
        return gates, hc_streams.hc_collapse_norm(Z, pre, weight, 1e-6)

    def one(expand: bool, tiles: dict):
        _, mixes, x = hc_streams.hc_site(X, fn, 1e-6, pre, weight, 1e-6, expand=(y, post, comb) if expand else None,
                                         tiles=tiles)
        return hc_gates(mixes, base, scale, 20, 1e-6), x

    for expand, site in ((False, "attention_site"), (True, "ffn_site_with_expand")):
        writes = streams if expand else 0
        want_gates, want = apart(expand)
        for form, dots in FORMS.items():
            report(f"{site}_apart_{form}", h200.cuda_time(lambda: apart(expand, dots), iters=10),
                   (3 if expand else 2) * streams + writes + row * (2 if expand else 1))
        for tiles in (dict(RAW_HEADS=True), FORMS["tf32_heads"], dict(TB=32, BLOCK=32), dict(TB=64, BLOCK=32),
                      dict(TB=32, BLOCK=64), dict(TB=16, BLOCK=64), dict(TB=32, BLOCK=32, num_stages=3),
                      dict(TB=64, BLOCK=32, num_stages=3), dict(TB=64, BLOCK=16),
                      # (sm_90: 94 registers without the expand, five programs an SM; 168 with it, three)
                      dict(TB=16, BLOCK=32, num_stages=2), dict(TB=16, BLOCK=32, num_stages=3)):
            label = "_".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in tiles.items())
            try:
                got_gates, got = one(expand, tiles)
                report(f"{site}_one_pass_{label}", h200.cuda_time(lambda: one(expand, tiles), iters=10),
                       streams + writes + row * (4 if expand else 3),
                       input_max_rel_diff=((got - want).abs().max() / want.abs().max()).item(),
                       comb_max_diff=(got_gates[2] - want_gates[2]).abs().max().item())
            except Exception as exc:  # a tile that needs more shared memory than an SM has
                h200.record("passes", f"{site}_one_pass_{label}", {"error": f"{type(exc).__name__}: {exc}"[:200]})
        site_operand(site, expand, X, y, post, comb, fn, pre, weight)


def bf16_sites(rows: int) -> None:
    """A prefill mHC site on bf16 streams (layers/mhc.BF16_STREAMS: half the bytes), its mixes'
    dots in the TF32 passes or (hc_streams.BF16_DOTS) as bf16 MMAs against fn's three bf16
    parts, in a few tiles, against the shipped site on the same values in fp32; each form's
    mixes next to the fp32 site's (the same values: fp32's accuracy apart)."""
    X = torch.randn(rows, STREAMS, HIDDEN, device="cuda").bfloat16()
    y = torch.randn(rows, HIDDEN, device="cuda")
    post, pre = torch.rand(rows, STREAMS, device="cuda") * 2, torch.rand(rows, STREAMS, device="cuda")
    comb = torch.softmax(torch.randn(rows, STREAMS, STREAMS, device="cuda"), -1)
    fn = torch.randn(MIXES, STREAMS * HIDDEN, device="cuda") / (STREAMS * HIDDEN) ** 0.5
    weight = torch.rand(HIDDEN, device="cuda") + 0.5
    parts = hc_streams.fn_parts(fn)
    row = 4 * y.numel()
    for expand, site in ((False, "attention_site"), (True, "ffn_site_with_expand")):
        before = (y, post, comb) if expand else None
        for form, Z, with_parts in (("fp32_streams", X.float(), None), ("bf16_streams", X, None),
                                    ("bf16_streams_bf16_dots", X, parts)):
            streams = Z.element_size() * Z.numel()
            others = (hc_streams.SITE_TILES[expand], dict(TB=64, BLOCK=16, num_stages=2),
                      dict(TB=32, BLOCK=16, num_stages=2))
            tiling = [None] if with_parts is None else [None] + [  # (PARTS_TILES first, then those unlike it)
                t for t in others if {**hc_streams.PARTS_TILES[expand], **t} != hc_streams.PARTS_TILES[expand]]
            for tiles in tiling:
                label = "" if tiles is None else "_" + "_".join(f"{k}{v}" for k, v in tiles.items())

                def one():
                    return hc_streams.hc_site(Z, fn, 1e-6, pre, weight, 1e-6, expand=before, tiles=tiles,
                                              parts=with_parts)
                try:
                    mixes = one()[1]
                    if form == "fp32_streams":
                        want = mixes
                    report(f"{site}_{form}{label}", h200.cuda_time(one, iters=10),
                           streams * (2 if expand else 1) + row * (4 if expand else 3),
                           mixes_max_rel_diff=((mixes - want).abs().max() / want.abs().max()).item())
                except Exception as exc:  # a tile that needs more shared memory than an SM has
                    h200.record("passes", f"{site}_{form}{label}", {"error": f"{type(exc).__name__}: {exc}"[:200]})
        if expand:  # (hc_streams.SPLIT_EXPAND) the expand in its own launch, then the site without it

            def split():
                streams = hc_streams.hc_expand(y, X, post, comb)
                return hc_streams.hc_site(streams, fn, 1e-6, pre, weight, 1e-6, parts=parts)
            mixes = split()[1]
            report(f"{site}_bf16_streams_bf16_dots_split", h200.cuda_time(split, iters=10),
                   2 * X.element_size() * X.numel() + row * 4,
                   mixes_max_rel_diff=((mixes - want).abs().max() / want.abs().max()).item())


def site_operand(site: str, expand: bool, X, y, post, comb, fn, pre, weight) -> None:
    """The site's input then its FP8 operand (rows_1x128 with the rounding inside, as the first
    product that reads it encodes it), against the site's pass writing the operand too
    (hc_streams.SITE_OPERAND), in the shipped tiles; the codes must be the same bits."""
    from dsflash.model.kernels import fp8_blockwise

    rows, before = X.shape[0], (y, post, comb) if expand else None
    streams, row, codes = 4 * X.numel(), 4 * y.numel(), y.numel()

    def then_encoded():
        _, _, x = hc_streams.hc_site(X, fn, 1e-6, pre, weight, 1e-6, expand=before)
        return fp8_blockwise.rows_1x128(x, round_first=True)

    def in_the_pass():
        operand = fp8_blockwise.empty_operand(rows, HIDDEN, 1, X.device)
        hc_streams.hc_site(X, fn, 1e-6, pre, weight, 1e-6, expand=before, operand=operand)
        return operand.codes, operand.scales

    was, hc_streams.SITE_OPERAND = hc_streams.SITE_OPERAND, True
    try:
        want, got = then_encoded(), in_the_pass()
        moved = (streams if expand else 0) + streams + row * (4 if expand else 3)
        report(f"{site}_then_encoded", h200.cuda_time(then_encoded, iters=10), moved + row + codes)
        report(f"{site}_encoding_in_the_pass", h200.cuda_time(in_the_pass, iters=10), moved + codes,
               same_codes=torch.equal(want[0], got[0]), same_scales=torch.equal(want[1], got[1]))
    finally:
        hc_streams.SITE_OPERAND = was


MIXES_ROWS = [hc_streams.MIXES_ROWS]  # --mixes-rows: the mixes' threshold when the fusions are on
SHIPPED = {"SITE_ROWS": hc_streams.SITE_ROWS, "RAW_HEADS": common.RAW_HEADS}


def fused(on: bool) -> None:
    """The three fusions on, or off (the passes as they were before them: no one-pass sites and
    the mixes' dots in Triton's tf32x3 either, which came later)."""
    attention_queries.ONE_PASS = on
    rope_kernel.IN_PLACE = on
    hc_streams.MIXES_ROWS = MIXES_ROWS[0] if on else 1 << 62
    hc_streams.SITE_ROWS = SHIPPED["SITE_ROWS"] if on else 0
    common.RAW_HEADS = SHIPPED["RAW_HEADS"] and on


def whole(n: int, rounds: int, act_quant: bool) -> None:
    model, _ = h200.build_model(fast=True, preset="bench", act_quant=act_quant)
    h200.hold_experts_once(model)  # as a worker holds them (a prefill with both forms ran out of 80 GB)
    mode = "faithful" if act_quant else "exact"
    for r in range(rounds + 1):  # round 0 warms both forms' kernels (its figures compile them)
        for on in (False, True):
            fused(on)
            h200.prefill(model, [n], f"whole_{mode}_{'fused' if on else 'before'}_round{r}", warm_first=r == 0)
    fused(True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--whole", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--act-quant", action="store_true", help="the whole prefills in faithful mode")
    parser.add_argument("--sections", default="queries,rope,mixes,sites")
    parser.add_argument("--mixes-rows", type=int, default=hc_streams.MIXES_ROWS,
                        help="hc_mixes from this many rows when fused (a huge value leaves it out)")
    args = parser.parse_args()
    MIXES_ROWS[0] = args.mixes_rows
    h200.DEADLINE[0] = time.monotonic() + args.budget_s
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, section in (("queries", queries), ("rope", output_rope), ("mixes", mixes), ("sites", sites),
                          ("bf16", bf16_sites)):
        if name in args.sections:
            section(args.rows)
    if args.whole:
        whole(args.whole, args.rounds, args.act_quant)


if __name__ == "__main__":
    main()
