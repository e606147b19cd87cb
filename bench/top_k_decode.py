"""The indexer's top-k at decode shapes: a verify block's 6 rows a request against a long
context's compressed entries (1M tokens: 262,144 entries at ratio 4), plain (an index source)
and masked to the candidate blocks (a reindex layer: 2,048 blocks of 8 entries finite, the
rest -inf). Those rows take the filtered form (top_k module doc): a floor, one filtering
launch, then one pick program a row over the ~3K kept scores, which the pick reads as tiles
(PICK_TILE places, PICK_WARPS warps) once a pass. Each variant (top_k settings, and the radix
digit's bits) is timed in a CUDA graph, as a decode step runs it, next to one read of the
scores, checked against the reference, and profiled by launch.

    python bench/top_k_decode.py [--entries 262144] [--requests 1,8,32] \\
        [--variants "PICK_SKIPS_SHARED_DIGITS=0;PICK_WARPS=16;bits=11"] [--device cpu]

At short contexts (--entries 1024: 4K tokens) the rows take the one-program select instead,
and have no candidate blocks to mask.
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
from unittest import mock

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402

HEADS, DIM, ROWS, K = 32, 128, 6, 512  # the bench preset's indexer; a verify block; index_topk
CANDIDATE_BLOCKS, CANDIDATE_BLOCK = 2048, 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=262144)
    parser.add_argument("--requests", default="1,8,32")
    parser.add_argument("--variants", default=";PICK_SKIPS_SHARED_DIGITS=0",
                        help="';'-separated variants, each ','-separated top_k settings NAME=int "
                             "and bits=B (radix digit); an empty one is the shipped form")
    parser.add_argument("--device", default="cuda", help="cpu (TRITON_INTERPRET=1): a smoke test, no timings")
    args = parser.parse_args()
    from dsflash.model.kernels import top_k
    from dsflash.model.kernels.indexer_score import indexer_scores
    from dsflash.model.quant import fake_quant_fp4

    dev, entries = args.device, args.entries
    if dev == "cpu":
        h200.time_nothing()
    g = torch.Generator(device=dev).manual_seed(0)
    pages, k_off, k_soff = h200.index_key_pages(entries, dev)
    variants = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in v.split(",") if kv)
                for v in args.variants.split(";")]
    for requests in (int(r) for r in args.requests.split(",")):
        n = requests * ROWS
        q = fake_quant_fp4(torch.randn(n, HEADS, DIM, device=dev, generator=g), 32)
        w = torch.randn(n, HEADS, device=dev, generator=g)
        scores = indexer_scores(q, w, torch.full((n,), entries, device=dev), pages, k_off, k_soff,
                                exact_in_bf16=True)
        kinds = [("index", scores)]
        if entries > CANDIDATE_BLOCKS * CANDIDATE_BLOCK:  # (a short context's rows are all candidates)
            blocks = torch.rand(n, entries // CANDIDATE_BLOCK, device=dev, generator=g).topk(CANDIDATE_BLOCKS).indices
            kept = torch.zeros(n, entries // CANDIDATE_BLOCK, dtype=torch.bool, device=dev).scatter_(-1, blocks, True)
            kinds.append(("candidates", scores.masked_fill(~kept.repeat_interleave(CANDIDATE_BLOCK, dim=-1),
                                                            float("-inf"))))
        read_us = scores.numel() * 4 / h200.HBM_BPS * 1e6
        for kind, rows in kinds:
            want = top_k.top_k_ascending_ref(rows, K)
            for variant in variants:
                settings = {name: value for name, value in variant.items() if name != "bits"}
                bits = variant.get("bits", top_k.RADIX_BITS)
                with mock.patch.multiple(top_k, **settings) if settings else contextlib.nullcontext():
                    def run():
                        return top_k.top_k_ascending_kernel(rows, K, radix_bits=bits)
                    t = h200.graph_time(run)
                    same = torch.equal(run(), want)
                    launches = {} if dev == "cpu" else {f"{name.strip('_')}_us": us
                                                        for name, us in h200.launch_times(run).items()}
                label = "_".join(f"{name}{value}" for name, value in variant.items()) or "shipped"
                h200.record("top_k_decode", f"N{entries}_R{requests}x{ROWS}_{kind}_{label}",
                            {"us": t * 1e6, "one_read_us": read_us, "matches_ref": same, **launches})



if __name__ == "__main__":
    main()
