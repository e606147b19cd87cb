"""The indexer's scores at decode shapes (a verify block of 6 queries a request against a long
context's index keys): the few-query form (entries as the dot's rows, heads and queries as
its columns) as shipped and with each of --settings (indexer_score's settings, one
NAME=literal a variant: FEW_TILES, FEW_HEADS_COLUMNS, FEW_PROGRAMS), against the short
tiles the decode rows took before, each next to its limits (the keys' bytes at HBM speed,
the FLOPs at bf16's). Queries are FP4-quantized as the model's are (one bf16 pass), so every
form's scores must match the short tiles' bit for bit; the table says so per row. With
--tall, a prefill slice's tall tiles too (128 queries).

    python bench/indexer_decode.py [--entries 1048576,524288] [--requests 1,8] [--rows 6] \\
        [--settings 'FEW_TILES=(128, 8);FEW_HEADS_COLUMNS=128'] [--tall] [--device cpu]
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import sys
from unittest import mock

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402

HEADS, DIM = 32, 128  # the bench preset's (and the release's) indexer heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default="1048576,524288,4096")
    parser.add_argument("--requests", default="1,8")
    parser.add_argument("--rows", type=int, default=6, help="queries a request (a verify block)")
    parser.add_argument("--settings", default="FEW_HEADS_COLUMNS=128",
                        help="';'-separated NAME=literal, each a variant of the shipped form")
    parser.add_argument("--tall", action="store_true", help="also 128 queries in prefill's tall tiles")
    parser.add_argument("--device", default="cuda", help="cpu (TRITON_INTERPRET=1): a smoke test, no timings")
    args = parser.parse_args()
    from dsflash.model.kernels import indexer_score
    from dsflash.model.kernels.indexer_score import TILES, indexer_scores
    from dsflash.model.quant import fake_quant_fp4

    dev = args.device
    if dev == "cpu":  # the interpreter: run every form once, time nothing
        h200.time_nothing()
    g = torch.Generator(device=dev).manual_seed(0)
    settings = [(name.strip(), ast.literal_eval(value)) for name, value in
                (v.split("=", 1) for v in args.settings.split(";") if v.strip())]
    for entries in (int(e) for e in args.entries.split(",")):
        pages, k_off, k_soff = h200.index_key_pages(entries, dev)
        for requests in (int(r) for r in args.requests.split(",")):
            n = requests * args.rows
            q = fake_quant_fp4(torch.randn(n, HEADS, DIM, device=dev, generator=g), 32)
            w = torch.randn(n, HEADS, device=dev, generator=g)
            visible = torch.full((n,), entries, device=dev)
            if requests == 1:
                tables = (k_off, k_soff)
                runs = None
            else:  # every request its own row of the tables (the same keys here)
                tables = (k_off.expand(requests, -1).contiguous(), k_soff.expand(requests, -1).contiguous())
                first = torch.arange(requests, device=dev) * args.rows
                runs = (first, torch.full((requests,), args.rows, device=dev), args.rows)
            nbytes = requests * entries * 68 + n * entries * 4  # keys a request, scores out
            flops = 2 * n * HEADS * DIM * entries
            limit = max(nbytes / h200.HBM_BPS, flops / h200.BF16_FLOPS)

            def scores(tiles=None):
                return indexer_scores(q, w, visible, pages, *tables, runs, exact_in_bf16=True, tiles=tiles,
                                      keys_aligned=True)  # index_key_pages' keys: 64 and 4 bytes apart

            want = scores(TILES["short"])
            forms = [("short", lambda: scores(TILES["short"]))]
            forms.append(("few", scores))  # as shipped

            def patched(attribute, value):  # the shipped form with one of its settings changed
                def run():
                    with mock.patch.object(indexer_score, attribute, value):
                        return scores()
                return run
            forms += [(f"{name}={value}".replace(" ", ""), patched(name, value)) for name, value in settings]
            for label, fn in forms:
                t = h200.graph_time(fn)
                same = torch.equal(fn(), want)
                h200.record("indexer_decode", f"N{entries}_R{requests}x{args.rows}_{label}",
                            {"us": t * 1e6, "limit_us": limit * 1e6, "ratio": t / limit, "bitwise_short": same})
        if args.tall:
            tall_rows(pages, k_off, k_soff, entries, g, dev)


def tall_rows(pages, k_off, k_soff, entries: int, g: torch.Generator, dev: str, n: int = 128) -> None:
    """A prefill slice's 128 queries in the tall tiles."""
    from dsflash.model.kernels.indexer_score import indexer_scores
    from dsflash.model.quant import fake_quant_fp4

    q = fake_quant_fp4(torch.randn(n, HEADS, DIM, device=dev, generator=g), 32)
    w = torch.randn(n, HEADS, device=dev, generator=g)
    visible = torch.full((n,), entries, device=dev)
    flops = 2 * n * HEADS * DIM * entries
    t = h200.cuda_time(lambda: indexer_scores(q, w, visible, pages, k_off, k_soff, exact_in_bf16=True, tall=True),
                       iters=5)
    h200.record("indexer_decode", f"N{entries}_n{n}_tall",
                {"us": t * 1e6, "TFLOPs": flops / t / 1e12, "ratio_to_bf16": t / (flops / h200.BF16_FLOPS)})

if __name__ == "__main__":
    main()
