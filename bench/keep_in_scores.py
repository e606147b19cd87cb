"""A long prompt's score slice and its top-k, three ways, on FP4 keys at the shapes a 1M
prompt's late chunks take (model/layers/indexer._SCORE_BUDGET: 128 queries of 1M entries, 512
of 256K), faithful mode's FP8 tall tiles with the queries encoded once:
- "filter": the scores, then the filtered top-k (floor from the written scores, the filtering
  launch, the pick; top_k.FILTER_PTX as it stands);
- "filter_ptx": the same with top_k.FILTER_PTX switched;
- "keep": indexer.KEEP_IN_SCORES' form: the floors from 4,096 sampled entries' scores, the
  score tiles keeping what reaches them (top_k.keep_tile, PTX), the pick.
Each next to the scores alone (the tiles without the keep), the scores' FP8 floor and one read
of the scores at the measured HBM rate; every form's ids against the reference's.

    python bench/keep_in_scores.py
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import indexer_score, top_k  # noqa: E402
from dsflash.model.kernels.indexer_score import indexer_scores  # noqa: E402
from dsflash.model.quant import fake_quant_fp4  # noqa: E402

dev, heads, dim, k = "cuda", 32, 128, 512
torch.manual_seed(0)
for rows, entries in ((128, 1 << 20), (512, 1 << 18)):
    pages, k_off, k_soff = h200.index_key_pages(entries, dev)
    q = fake_quant_fp4(torch.randn(rows, heads, dim, device=dev), 32)
    w = torch.randn(rows, heads, device=dev)
    visible = torch.full((rows,), entries, device=dev)
    qe, we = indexer_score.fp8_queries(q.float(), w)  # once, as a run encodes its queries
    options = dict(exact_in_bf16=True, tall=True, fp8=True, encoded=True, pad=True)
    width = indexer_score.padded_width(entries)
    sample = indexer_score.entry_sample(visible, k_off, k_soff, top_k.sample_columns(entries, q.device))

    def scores(keep=None):
        return indexer_scores(qe, we, visible, pages, k_off, k_soff, **options, keep=keep)

    def filtered():
        return top_k.top_k_ascending_kernel(scores(), k)

    def kept():
        sampled = indexer_score.sampled_scores(qe, we, pages, sample, slice(None), None, **options)
        work = top_k.kept_work(rows, width, k, q.device, atomic=True, floor=top_k.sample_floors(sampled, k, entries))
        return top_k.pick_kept(scores(work), k, work)

    want = top_k.top_k_ascending_ref(scores(), k)
    t_scores = h200.cuda_time(scores, iters=5)
    floor = 2 * rows * entries * heads * dim / h200.FP8_FLOPS
    read = rows * width * 4 / h200.HBM_BPS
    line = [f"scores {t_scores * 1e6:.0f} us ({t_scores / floor:.2f}x FP8 floor)"]
    shipped = top_k.FILTER_PTX
    for label, fn, ptx in (("filter", filtered, shipped), ("filter_ptx", filtered, not shipped), ("keep", kept, shipped)):
        top_k.FILTER_PTX = ptx
        t = h200.cuda_time(fn, iters=5)
        same = torch.equal(fn(), want)
        line.append(f"{label} {t * 1e6:.0f} us (+{(t - t_scores) * 1e6:.0f} over the scores){'' if same else ' MISMATCH'}")
        h200.record("keep_in_scores", f"n{rows}_N{entries}_{label}",
                    {"us": t * 1e6, "scores_us": t_scores * 1e6, "fp8_floor_us": floor * 1e6,
                     "one_read_us": read * 1e6, "matches_ref": same})
    top_k.FILTER_PTX = shipped
    print(f"[keep] {rows} x {entries}, k {k}: " + "; ".join(line) + f"; one read of the scores {read * 1e6:.0f} us",
          flush=True)
