"""top_k_ascending: which entries a query keeps, exactly (ties, -inf, signed zeros)."""

import pytest
import torch

from dsflash.model.layers.indexer import top_k_ascending

INF = float("inf")


def _oracle(row: list[float], k: int) -> list[int]:
    """Sort by (score descending, id ascending), keep k, drop -inf, pad with -1, ascending."""
    best = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    kept = sorted(i for i in best if row[i] > -INF)
    return kept + [-1] * (k - len(kept))


def test_ties_at_the_cut_go_to_the_lower_id():
    scores = torch.tensor([[1.0, 3.0, 1.0, 1.0, 3.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    assert top_k_ascending(scores, 3).tolist() == [[0, 1, 4], [0, 1, 2]]


def test_minus_inf_rows_pad_with_minus_one():
    scores = torch.tensor([[-INF, 5.0, -INF, -INF], [-INF] * 4, [INF, -INF, 0.5, -1.0]])
    assert top_k_ascending(scores, 3).tolist() == [[1, -1, -1], [-1, -1, -1], [0, 2, 3]]


def test_negative_zero_ties_with_zero():
    scores = torch.tensor([[-0.0, 0.0, -1.0, -0.0], [0.0, -0.0, -0.0, 0.0]])
    assert top_k_ascending(scores, 2).tolist() == [[0, 1], [0, 1]]


def test_empty_k_and_rows():
    assert top_k_ascending(torch.zeros(2, 5), 0).shape == (2, 0)
    assert top_k_ascending(torch.zeros(0, 5), 3).shape == (0, 3)


def test_random_rows_match_the_oracle():
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.5, -INF, INF, 1e-40, -1e-40, -3.5])
    for width in (1, 7, 33):
        for k in range(width + 1):
            scores = pool[torch.randint(0, len(pool), (6, width), generator=g)]
            want = [_oracle(row, k) for row in scores.tolist()]
            assert top_k_ascending(scores, k).tolist() == want


def test_candidate_blocks_are_the_best_block_maxima_and_the_newest_block():
    """select_candidate_blocks keeps, per row, the blocks of the topk best maxima (a block's
    maximum is -inf where all of it is, NaN where it holds one: a NaN takes a place of the
    top-k and is not returned) and always the block of the newest visible entry; the last
    block may be short."""
    from dsflash.model.layers.indexer import candidate_entries, select_candidate_blocks

    g = torch.Generator().manual_seed(0)
    n, width, block, topk = 3, 45, 4, 3  # 12 blocks, the last one of 1 entry
    scores = torch.randn(n, width, generator=g)
    scores[0, 8:12] = 50.0  # block 2 best
    scores[1, 20:24] = -INF  # block 5 all -inf
    scores[1, 30] = float("nan")  # block 7 holds a NaN: it ranks first
    scores[2, 44] = 60.0  # the short last block
    visible = torch.tensor([45, 13, 45])
    blocks = select_candidate_blocks(scores, visible, topk, block)
    assert blocks.shape == (n, 12) and blocks.dtype == torch.bool
    keep = candidate_entries(blocks, block, width)
    maxima = torch.nn.functional.pad(scores, (0, -width % block), value=-INF).view(n, -1, block)
    for r in range(n):
        nan = maxima[r].isnan().any(-1)
        row = maxima[r].nan_to_num(nan=INF).amax(-1)
        row[(visible[r] - 1) // block] = INF
        ranked = sorted(range(row.shape[0]), key=lambda b: (not nan[b], -row[b].item(), b))  # NaN first
        want = {b for b in ranked[:topk] if not nan[b]}
        got = {b for b in range(row.shape[0]) if keep[r, b * block]}
        assert got == want, (r, got, want)
        assert torch.equal(keep[r], torch.tensor([b in want for b in range(row.shape[0])]).repeat_interleave(
            block)[:width])
    assert keep[0, 8] and not keep[1, 28] and keep[1, 12] and keep[2, 44]


def test_faithful_prefill_sends_its_tall_score_tiles_to_the_fp8_form(golden_dir, golden, monkeypatch):
    """The tiny checkpoint on the kernel path in faithful mode, a prompt long enough to take the
    tall score tiles (TALL_RUN lowered to its rows) in several slices: with the FP8 form on
    (TALL_FP8), its score launches take it, its queries encoded once a layer, and the logits
    are the bf16 form's bit for bit (its scores are, where block scales span at most 8
    binades and the FP8 MMA's sums are exact; under the interpreter both dot exactly)."""
    from dsflash.model.kernels import indexer_score
    from dsflash.model.layers import indexer
    from tests.model.test_prefill_gemms import kernel_path_prefill

    monkeypatch.setattr(indexer, "TALL_RUN", 16)
    monkeypatch.setattr(indexer, "_SCORE_BUDGET", 64)  # several score slices a layer
    encoded = []
    fp8_queries = indexer_score.fp8_queries
    monkeypatch.setattr(indexer_score, "fp8_queries", lambda q, w: encoded.append(q.shape[0]) or fp8_queries(q, w))
    prompt = golden[2]["input_ids"][:24]
    logits = {}
    for on in (True, False):
        monkeypatch.setattr(indexer_score, "TALL_FP8", on)
        encoded.clear()
        logits[on] = kernel_path_prefill(golden_dir, True)(prompt, "last")
        assert bool(encoded) == on
        assert all(rows == 24 for rows in encoded)  # a run's queries encoded once, not once a slice
    assert torch.equal(logits[True], logits[False])


def test_a_long_prompts_score_tiles_filter_its_top_k_as_they_make_the_scores(golden_dir, golden, monkeypatch):
    """KEEP_IN_SCORES: the tiny checkpoint's prompt on the kernel path in tall tiles and several
    score slices a layer, its rows filtered (FILTER_SHARE lowered to their length): the rows'
    floors from sampled scores, each slice's kept scores from the tiles' epilogue, the picks from them
    (pick_kept), and the logits those of the filtering launch's top-k to the bit, in faithful
    mode (the FP8 tiles) and through the candidate pool's layers."""
    from dsflash.model.kernels import top_k
    from dsflash.model.layers import indexer
    from tests.model.test_prefill_gemms import kernel_path_prefill

    monkeypatch.setattr(indexer, "TALL_RUN", 16)
    monkeypatch.setattr(indexer, "_SCORE_BUDGET", 24 * 16)  # slices of 16 queries
    monkeypatch.setattr(top_k, "FILTER_SHARE", 1)
    monkeypatch.setattr(top_k, "SAMPLE", 32)  # the floors' sampled scores in two launches of 12 rows
    picked = []
    pick_kept = top_k.pick_kept
    monkeypatch.setattr(top_k, "pick_kept", lambda x, k, work: picked.append(work) or pick_kept(x, k, work))
    prompt = golden[2]["input_ids"][:24]
    prefill = kernel_path_prefill(golden_dir, True)
    logits = {}
    for on in (True, False):
        monkeypatch.setattr(indexer, "KEEP_IN_SCORES", on)
        picked.clear()
        logits[on] = prefill(prompt, "last")
        assert bool(picked) == on
        # (rows whose kept scores the tiles filled hold the picks: not every row selected whole)
        assert not on or any(bool((work.counts.sum(1) >= 4).any()) for work in picked)
    assert torch.equal(logits[True], logits[False])


@pytest.mark.gpu
def test_a_long_prompts_top_k_beside_its_next_scores_picks_the_same(golden_dir, golden, monkeypatch):
    """TOP_K_BESIDE: each score slice's top-k on a side stream while the next slice is scored
    (the score budget lowered so the tiny checkpoint's prompt takes several slices a layer):
    the same logits to the bit, and the side stream used."""
    from dsflash.model.layers import indexer
    from tests.model.test_prefill_gemms import kernel_path_prefill

    monkeypatch.setattr(indexer, "_SCORE_BUDGET", 4 * 64)  # a few queries a slice
    prompt = golden[2]["input_ids"][:64]
    prefill = kernel_path_prefill(golden_dir, True)
    logits = {}
    for on in (False, True):
        monkeypatch.setattr(indexer, "TOP_K_BESIDE", on)
        logits[on] = prefill(prompt, "all")
    assert indexer._SIDE_STREAMS and torch.equal(logits[True], logits[False])


@pytest.mark.gpu
def test_the_top_k_beside_reuses_its_slices_memory_in_stream_order(monkeypatch):
    """With the host far ahead of the GPU (a long sleep queued first), 16 slices picked beside
    the main stream take the memory of ~3 slices' scores at most: each slice's scores return to
    the main stream's pool in stream order once its top-k is waited for (record_stream kept
    every slice's block until the host saw its top-k end, so each took new memory). The picks
    are the main stream's own top-k's."""
    from dsflash.model.layers import indexer

    monkeypatch.setattr(indexer, "TOP_K_BESIDE", True)
    device = torch.device("cuda")
    rows, width, k = 128, 1 << 20, 512  # a 1M prompt's slice: 512 MiB of scores (the top-k's own
    slice_bytes = rows * width * 4  # work buffers, 256 MiB on the side stream, fit in the margin)
    seeds = [torch.randn(rows, width, device=device) for _ in range(2)]
    want = [top_k_ascending(s, k) for s in seeds]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    pick, join = indexer._top_k_beside(device, slices=True)
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time: the host queues every slice behind it
    picks = []
    for i in range(16):
        picks.append(pick(seeds[i % 2] * 1.0, k))  # a fresh tensor a slice, as score(lo, hi) makes
    join()
    grown = torch.cuda.memory_reserved() - reserved
    torch.cuda.synchronize()
    assert all(torch.equal(p, want[i % 2]) for i, p in enumerate(picks))
    assert grown <= 5 * slice_bytes, f"{grown / slice_bytes:.1f} slices of scores reserved"  # (16 before)


@pytest.mark.parametrize("rows", [16384, 1000, 8])
def test_the_largest_top_k_slice_takes_the_most_work_memory(rows):
    """largest_top_k_slice (what a worker's start runs to meet its long prompts' top-k work
    memory, reserve_top_k_work): of every entry count a run of `rows` queries can slice its
    scores at, it takes the filtered form's most work buffers, which the places a chunk bound
    (top_k.places, a power of two: up to twice a chunk's scores): under 1.75 GiB (1,008 x
    133,121 entries at k = 512) where 8,192 places whatever the length made 2,048 x 65,536
    take 4 GiB, and the tiny checkpoint's k = 4 up to 8 GiB."""
    from types import SimpleNamespace

    from dsflash.model.kernels import indexer_score, top_k
    from dsflash.model.layers import indexer

    for k in (512, 4):
        cfg = SimpleNamespace(index_topk=k, max_position_embeddings=1 << 20)

        def work(entries: int) -> int:  # a slice's queries follow its entries, its top-k its padded rows
            queries = min(rows, max(1, indexer._SCORE_BUDGET // entries))
            return top_k.work_bytes(queries, indexer_score.padded_width(entries), k)

        queries, entries = indexer.largest_top_k_slice(cfg, rows, 1 << 20)
        assert queries == min(rows, indexer._SCORE_BUDGET // entries)
        first = top_k.filter_share(rows) * k  # (a slice's rows are all of them up to 2^27 / 16,384 entries)
        lengths = [n + d for n in range(-(-first // 512) * 512, 1 << 20, 512) for d in (0, 1, 7)]
        lengths += list(range(first - 20, first + 2))
        assert work(entries) == max(work(n) for n in lengths) > 0
        width = indexer_score.padded_width(entries)
        assert indexer.top_k_work_bytes(cfg, rows, 1 << 20) == work(entries) + queries * width * 4
        # rows just short of the filtered form's, padded into it (PADDED_ROWS): their work counts
        assert indexer.largest_top_k_slice(cfg, rows, first - 15) == (min(rows, indexer._SCORE_BUDGET // (first - 15)),
                                                                       first - 15)
        assert work(entries) < 1.75 * 2**30 and work(65536) <= 1 << 30
        # prompts too short for the filtered form (a small pool, a short context): nothing to hold
        assert indexer.largest_top_k_slice(cfg, rows, first - 16) is None
        assert indexer.top_k_work_bytes(cfg, rows, first - 16) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("beside", [False, True])
def test_a_workers_top_k_work_is_held_at_start(beside, monkeypatch):
    """reserve_top_k_work runs the largest slice's top-k (on the side stream too with
    TOP_K_BESIDE), and the caching allocator keeps its work memory for the long prompts."""
    from types import SimpleNamespace

    from dsflash.model.layers import indexer

    monkeypatch.setattr(indexer, "TOP_K_BESIDE", beside)
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    indexer.reserve_top_k_work(torch.device("cuda"), SimpleNamespace(index_topk=512, max_position_embeddings=1 << 20),
                               16384, 1 << 20)
    assert torch.cuda.memory_reserved() - reserved >= (1 << 30) * (2 if beside else 1)
