"""The indexer's top-k on long rows: the radix select over every score (four counting passes
and a writing one, each reading the row) against the filtered form (a floor from a sample of
each row, one read that keeps the scores above it, the radix select over those; "filtered_ptx"
with top_k.FILTER_PTX switched), on indexer
scores of FP4 keys at the shapes a long prefill takes (model/layers/indexer._SCORE_BUDGET:
128 queries of 1M entries, 256 of 512K, 512 of 256K: a 1M-token prompt's last chunks, whose
KV sources hold one entry per 4 tokens) and at decode's (6 rows of 1M entries, the candidate
blocks' 48 rows of 128K). Each next to the time one read of the scores takes at the measured
HBM rate, and beside the time of the scores themselves (the prefill's tall tiles).

    python bench/top_k_long_rows.py [--shapes "16384,8191,512;2048,65535,512"] [--labels radix,filtered]

--shapes: those slices only (rows, entries, k; the tall score tiles), e.g. a prefill chunk's at
contexts under 256K tokens, whose rows the top-k takes unfiltered (shorter than FILTER_SHARE k).
--labels probe: the filtering launch alone with the rows' floors and with a floor nothing
reaches, against torch's amax over the same rows; --labels runs: the floor's sample in runs of
consecutive ids (top_k.SAMPLE_RUN).
"""
import argparse
import pathlib
import sys
from unittest import mock

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels.indexer_score import indexer_scores  # noqa: E402
from dsflash.model.kernels import top_k  # noqa: E402
from dsflash.model.kernels.top_k import top_k_ascending_kernel, top_k_ascending_ref  # noqa: E402
from dsflash.model.quant import fake_quant_fp4  # noqa: E402

dev, heads, dim = "cuda", 32, 128


def slice_inputs(rows: int, entries: int) -> tuple:
    """(q, w, visible, pages, key offsets, key scale offsets) of a score slice: FP4-quantized
    queries against `entries` FP4 keys, every entry visible."""
    pages, k_off, k_soff = h200.index_key_pages(entries, dev)
    q = fake_quant_fp4(torch.randn(rows, heads, dim, device=dev), 32)
    return q, torch.randn(rows, heads, device=dev), torch.full((rows,), entries, device=dev), pages, k_off, k_soff


def run_forms(scores: torch.Tensor, k: int, want: torch.Tensor) -> list[str]:
    """The floor's sample in runs (top_k.SAMPLE_RUN 1, 4, 8, 16; alternated twice): the floor's
    launch alone, the whole filtered top-k (checked against the reference's picks), and how many
    scores a row its floor keeps (mean, most)."""
    shipped, N, line = top_k.SAMPLE_RUN, scores.shape[1], []
    runs = (1, 4, 8, 16)
    floors, wholes = {run: [] for run in runs}, {run: [] for run in runs}
    for _ in range(2):
        for run in runs:
            top_k.SAMPLE_RUN = run
            floors[run].append(h200.cuda_time(lambda: top_k.sample_floors(scores, k, N, sample=top_k.SAMPLE), iters=20))
            wholes[run].append(h200.cuda_time(lambda: top_k_ascending_kernel(scores, k, filtered=True), iters=10))
    for run in runs:
        top_k.SAMPLE_RUN = run
        same = torch.equal(top_k_ascending_kernel(scores, k, filtered=True), want)
        work = top_k.kept_work(*scores.shape, k, scores.device)
        top_k.filter_rows(scores, k, work)
        kept = work.counts.sum(dim=1).float()
        floor_us, whole_us = min(floors[run]) * 1e6, min(wholes[run]) * 1e6
        line.append(f"run {run}: floor {floor_us:.1f} us, filtered {whole_us:.0f} us, kept {kept.mean():.0f} "
                    f"(most {kept.max():.0f}){'' if same else ' MISMATCH'}")
        h200.record("top_k_long_rows", f"n{scores.shape[0]}_N{N}_k{k}_sample_run{run}",
                    {"floor_us": floor_us, "filtered_us": whole_us, "kept_mean": kept.mean().item(),
                     "kept_most": kept.max().item(), "matches_ref": same})
    top_k.SAMPLE_RUN = shipped
    return line


def filter_probe(scores: torch.Tensor, k: int) -> list[str]:
    """The filtering launch alone (its floors given: the rows' own, and one no score reaches),
    against torch's amax over the same rows (a read at what torch's reduction reaches): how far
    the filter is from its bytes, and how much of that its kept scores cost."""
    n, N = scores.shape
    work = top_k.kept_work(n, N, k, scores.device)
    own = top_k.sample_floors(scores, k, N, sample=top_k.SAMPLE)
    none = torch.full_like(own, -1)  # 0xFFFFFFFF: only a positive NaN reaches it

    def reset():
        work.counts.zero_()
        work.tops.fill_(top_k._NO_TOP.value)

    def filtered(floor):
        reset()
        work.floor.copy_(floor)
        with mock.patch.object(top_k, "sample_floors", lambda *args, **kwargs: None):
            top_k.filter_rows(scores, k, work)

    times = {"reset": h200.cuda_time(lambda: (reset(), work.floor.copy_(own)), iters=20),
             "own_floors": h200.cuda_time(lambda: filtered(own), iters=20),
             "no_keeps": h200.cuda_time(lambda: filtered(none), iters=20),
             "amax": h200.cuda_time(lambda: scores.amax(dim=1), iters=20)}
    read_us = scores.numel() * 4 / h200.HBM_BPS * 1e6
    h200.record("top_k_long_rows", f"n{n}_N{N}_k{k}_filter_probe",
                {**{f"{name}_us": t * 1e6 for name, t in times.items()}, "one_read_us": read_us})
    return ["filter probe: " + ", ".join(f"{name} {t * 1e6:.0f} us" for name, t in times.items())]


parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="", help="';'-separated rows,entries,k slices (tall tiles) instead")
parser.add_argument("--labels", default="", help="','-separated forms to time (all where empty)")
args = parser.parse_args()
shapes = ((128, 1 << 20, 512, True), (256, 1 << 19, 512, True), (512, 1 << 18, 512, True),
          (6, 1 << 20, 512, False), (48, 1 << 17, 2048, False))
if args.shapes:
    shapes = tuple((*(int(v) for v in shape.split(",")), True) for shape in args.shapes.split(";"))
torch.manual_seed(0)
for rows, entries, k, tall in shapes:
    inputs = slice_inputs(rows, entries)

    def score():
        return indexer_scores(*inputs, exact_in_bf16=True, tall=tall)

    t_score = h200.cuda_time(score, iters=5)
    scores = score()
    want = top_k_ascending_ref(scores, k)
    read = scores.numel() * 4 / h200.HBM_BPS
    line = [f"scores {t_score * 1e6:.0f} us"]
    defaults = top_k.FILTER_STAGES, top_k.FILTER_WARPS, dict(top_k.FILTER_PLANS), top_k.FILTER_PTX
    switched = {name: plan._replace(atomic=not plan.atomic) for name, plan in defaults[2].items()}
    for label, options, launch in (("radix", dict(filtered=False), defaults),
                                   ("filtered", dict(filtered=True), defaults),
                                   ("filtered_ptx", dict(filtered=True), defaults[:3] + (not defaults[3],)),
                                   ("filtered_places_switched", dict(filtered=True),
                                    defaults[:2] + (switched, defaults[3])),
                                   # (decode's rows take prefix sums, which the PTX form does not)
                                   ("filtered_places_switched_ptx", dict(filtered=True),
                                    defaults[:2] + (switched, not defaults[3])),
                                   ("filtered_1_stage_8_warps", dict(filtered=True), (1, 8) + defaults[2:]),
                                   ("filtered_block1024", dict(filtered=True, block=1024), defaults),
                                   ("filtered_block2048", dict(filtered=True, block=2048), defaults),
                                   ("filtered_8_chunks", dict(filtered=True, chunks=8), defaults)):
        if args.labels and label not in args.labels.split(","):
            continue

        def pick():
            top_k.FILTER_STAGES, top_k.FILTER_WARPS, _, top_k.FILTER_PTX = launch
            top_k.FILTER_PLANS.update(launch[2])
            return top_k_ascending_kernel(scores, k, **options)

        t = h200.cuda_time(pick, iters=10)
        same = torch.equal(pick(), want)
        line.append(f"{label} {t * 1e6:.0f} us ({t / read:.1f} reads){'' if same else ' MISMATCH'}")
        h200.record("top_k_long_rows", f"n{rows}_N{entries}_k{k}_{label}",
                    {"us": t * 1e6, "one_read_us": read * 1e6, "scores_us": t_score * 1e6, "matches_ref": same})
    # the filtered form's launches, each on its own
    top_k.FILTER_STAGES, top_k.FILTER_WARPS, _, top_k.FILTER_PTX = defaults
    top_k.FILTER_PLANS.update(defaults[2])
    if not args.labels or "probe" in args.labels.split(","):
        line += filter_probe(scores, k)
    if not args.labels or "runs" in args.labels.split(","):
        line += run_forms(scores, k, want)
    launches = [f"{name} {us:.0f} us" for name, us in
                h200.launch_times(lambda: top_k_ascending_kernel(scores, k, filtered=True)).items()]
    print(f"[top_k] {rows} x {entries}, k {k}: " + ", ".join(line) + f"; one read {read * 1e6:.0f} us"
          + f"; filtered by launch: {', '.join(launches)}", flush=True)

# A prefill slice's rows as a run meets them: an odd entry count (a layer's entries are rarely
# a multiple of 16), its scores in rows of that length, against the same scores in rows padded
# to a multiple of 16 with -inf (indexer.PADDED_ROWS): the top-k's loads are 4 bytes wide on
# the first, 16 on the second (sm_90 SASS). The scores themselves alike (their stores).
for rows, entries, k in () if args.shapes else ((128, (1 << 20) - 1, 512), (256, (1 << 19) - 1, 512)):
    inputs = slice_inputs(rows, entries)
    line, picks = [], {}
    for pad in (False, True):
        def score(pad=pad):
            return indexer_scores(*inputs, exact_in_bf16=True, tall=True, pad=pad)

        t_score = h200.cuda_time(score, iters=5)
        scores = score()
        t_pick = h200.cuda_time(lambda: top_k_ascending_kernel(scores, k, filtered=True), iters=10)
        picks[pad] = top_k_ascending_kernel(scores, k, filtered=True)
        label = "padded" if pad else "odd"
        line.append(f"{label}: scores {t_score * 1e6:.0f} us, top-k {t_pick * 1e6:.0f} us")
        h200.record("top_k_long_rows", f"n{rows}_N{entries}_k{k}_{label}_rows",
                    {"scores_us": t_score * 1e6, "top_k_us": t_pick * 1e6,
                     "one_read_us": scores.numel() * 4 / h200.HBM_BPS * 1e6})
    print(f"[top_k] {rows} x {entries} (odd), k {k}: " + "; ".join(line)
          + f"; the same picks: {torch.equal(picks[False], picks[True])}", flush=True)
