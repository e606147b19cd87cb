"""The paged cache: the real storage formats behave exactly like the dense reference, round
trips are exact, memory comes back, and the bytes per token are what the formats say."""

import pytest
import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache, page_offsets
from dsflash.kvcache.pool import CachePool, PoolExhausted
from dsflash.kvcache.state import DenseCache
from dsflash.kvcache.transport.checksum import SealedSums, checksum
from dsflash.model.kernels.page_offsets import page_offsets_kernel
from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from dsflash.model.runner import prompt_logits, step


def _pool(config, pages=400, slots=6, page_entries=16, device="cpu"):
    return CachePool(CacheLayout.for_model(config, page_entries=page_entries), pages, slots)


def test_paged_equals_dense_bit_for_bit(golden_model, golden):
    pool = _pool(golden_model.config)
    for prompt in golden:
        ids = prompt["input_ids"]
        paged, dense = PagedCache(pool, golden_model.config), DenseCache(golden_model.config)
        with torch.inference_mode():
            a = prompt_logits(golden_model, ids, "chunked:9", cache=paged)
            b = prompt_logits(golden_model, ids, "chunked:9", cache=dense)
        assert torch.equal(a, b)
        paged.release()
    assert pool.is_empty()


def test_serialize_copy_and_rollback_are_exact(golden_model, golden):
    pool, other = _pool(golden_model.config), _pool(golden_model.config, page_entries=16)
    ids = golden[2]["input_ids"]
    with torch.inference_mode():
        cache = PagedCache(pool, golden_model.config)
        step(golden_model, [cache], [ids[:77]])
        moved = cache.copy_to(other)
        desc, payload = cache.serialize()
        assert payload.numel() == desc.payload_bytes(pool.layout)
        restored = PagedCache.deserialize(pool, golden_model.config, desc, payload)
        for c in (cache, moved, restored):
            step(golden_model, [c], [ids[77:78]])
        # a speculative block that is then rejected leaves no trace (wrong tokens on purpose),
        # rolled back alone or with another cache's (a decode step's truncate_many)
        step(golden_model, [restored], [torch.tensor([5, 6, 7, 8, 9, 10])])
        restored.truncate(78)
        for c in (moved, restored):
            step(golden_model, [c], [torch.tensor([11, 12, 13])])
        PagedCache.truncate_many([(moved, 78), (restored, 78)])
        outs = [step(golden_model, [c], [ids[78:90]], logits="all").logits[0] for c in (cache, moved, restored)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], outs[2])
    for c in (cache, moved, restored):
        c.release()
    assert pool.is_empty() and other.is_empty()


def test_full_pages_are_sealed_and_unsealed_before_they_change(golden_model, golden):
    """Sealed = a page's checksum taken when it filled; every way a page can be written again
    (cut back, written from outside, freed) drops the seal first."""
    layout = CacheLayout.for_model(golden_model.config, page_entries=8)
    pool = CachePool(layout, 400, 2, sealed=SealedSums())
    ids = golden[2]["input_ids"]
    pages = pool.pages_buffer.numpy()

    def sealed_pages(cache):
        return {s: [p for p in t if pool.sealed.lookup(pool.pages_segment, p * layout.page_bytes, layout.page_bytes)
                    is not None] for s, t in cache.page_table.items()}

    with torch.inference_mode():
        cache = PagedCache(pool, golden_model.config)
        step(golden_model, [cache], [ids[:77]])
        cache.seal_full_pages()
        for source, table in cache.page_table.items():
            full = table[:cache.counts[source] // layout.page_entries]
            assert full and sealed_pages(cache)[source] == full
            for page in full:
                data = pages[page * layout.page_bytes:(page + 1) * layout.page_bytes]
                assert pool.sealed.lookup(pool.pages_segment, page * layout.page_bytes, layout.page_bytes) == checksum(data)
        cache.truncate(40)
        for source, table in cache.page_table.items():
            assert sealed_pages(cache)[source] == table[:cache.counts[source] // layout.page_entries]
        cache.bytes_changed()
        assert not any(sealed_pages(cache).values())
        step(golden_model, [cache], [ids[40:80]])
        cache.seal_full_pages()
        assert len(pool.sealed) == sum(c // layout.page_entries for c in cache.counts.values())
        cache.release()
    assert len(pool.sealed) == 0 and pool.is_empty()


def test_incompatible_layouts_are_refused(golden_model):
    pool = _pool(golden_model.config)
    cache = PagedCache(pool, golden_model.config)
    desc, payload = cache.serialize()
    other = _pool(golden_model.config, page_entries=32)
    with pytest.raises(ValueError, match="incompatible cache layout"):
        PagedCache.deserialize(other, golden_model.config, desc, payload)
    cache.release()


def test_pool_exhaustion_is_an_error_not_a_crash(golden_model, golden):
    pool = _pool(golden_model.config, pages=3, slots=1, page_entries=8)
    cache = PagedCache(pool, golden_model.config)
    with pytest.raises(PoolExhausted):
        cache.reserve(200)
    with pytest.raises(PoolExhausted):
        PagedCache(pool, golden_model.config)  # no free slot
    cache.release()
    cache.release()  # idempotent
    assert pool.is_empty()


def test_a_new_pool_never_takes_a_freed_pools_serial():
    """CUDA graphs that write a pool's buffers are keyed by its serial. id() can come back for
    a later pool once one is freed (CPython reuses the memory): a graph keyed by it would
    replay a freed pool's writes into whatever took that pool's memory."""
    config = ModelConfig.from_dict(preset_config("tiny"))
    serials = []
    for _ in range(8):
        pool = _pool(config, pages=4, slots=1)
        serials.append(pool.serial)
        del pool
    assert len(set(serials)) == len(serials)


def test_bytes_per_token_of_a_100k_token_request():
    """The release layout, filled with 100k tokens of entries: 356 B per entry, 890 B/token."""
    config = ModelConfig.from_dict(preset_config("bench"))
    layout = CacheLayout.for_model(config, page_entries=256)
    assert layout.entry_bytes == 356 and layout.global_bytes_per_token == 890.0
    tokens = 100_000
    pool = CachePool(layout, num_pages=layout.pages_for(tokens), num_slots=1)
    cache = PagedCache(pool, config)
    cache.reserve(tokens)
    for source, count in layout.entries_for(tokens).items():
        kv = torch.zeros(count, layout.head_dim)
        keys = torch.zeros(count, layout.index_dim)
        packed = ((torch.zeros(count, layout.kv_codes_bytes, dtype=torch.uint8),
                   torch.zeros(count, layout.kv_scale_bytes, dtype=torch.uint8)),
                  (torch.zeros(count, layout.key_codes_bytes, dtype=torch.uint8),
                   torch.zeros(count, layout.key_scale_bytes, dtype=torch.uint8)))
        cache.entries_append(source, kv, keys, packed)
    cache.num_tokens = tokens
    global_bytes = sum(len(t) for t in cache.page_table.values()) * layout.page_bytes
    total = global_bytes + layout.slot_bytes
    print(f"\n100k-token request: {global_bytes / tokens:.1f} B/token global (pages), "
          f"{total / tokens:.1f} B/token with the window rings ({layout.slot_bytes / 2**20:.2f} MiB slot)")
    assert 890 <= global_bytes / tokens < 900  # page rounding only
    assert pool.free_page_count == 0
    cache.release()


def _random_entries(layout, count, g):
    def codes(width):
        return torch.randint(0, 256, (count, width), dtype=torch.uint8, generator=g)

    packed = ((codes(layout.kv_codes_bytes), codes(layout.kv_scale_bytes)),
              (codes(layout.key_codes_bytes), codes(layout.key_scale_bytes)))
    return torch.randn(count, layout.head_dim, generator=g), torch.randn(count, layout.index_dim, generator=g), packed


def test_a_batch_of_caches_appends_entries_as_each_alone(golden_model):
    """A forward over several requests appends their new entries in one write per section:
    pages, counts and the kept index keys come out as with one append per cache."""
    g = torch.Generator().manual_seed(5)
    pools = [_pool(golden_model.config, pages=60, page_entries=4) for _ in range(2)]
    layout = pools[0].layout
    source = layout.sources[0]
    alone, together = ([PagedCache(pool, golden_model.config) for _ in range(3)] for pool in pools)
    together[1].index_keys(source)  # this one keeps its dequantized keys: they must grow too
    alone[1].index_keys(source)
    for counts in ([3, 1, 6], [2, 5, 1], [4, 4, 4]):  # across page boundaries, in differing steps
        kv, keys, packed = _random_entries(layout, sum(counts), g)
        PagedCache.entries_append_runs(source, list(zip(together, counts)), kv, keys, packed)
        at = 0
        for cache, n in zip(alone, counts):
            rows, at = slice(at, at + n), at + n
            cache.entries_append(source, kv[rows], keys[rows], tuple(tuple(t[rows] for t in c) for c in packed))
    assert torch.equal(pools[0].pages, pools[1].pages)
    for a, b in zip(alone, together):
        assert a.counts == b.counts and a.page_table == b.page_table
        assert torch.equal(a.index_keys(source), b.index_keys(source))
    assert torch.equal(together[1]._keys[source], alone[1]._keys[source])


@pytest.mark.parametrize("requests", [2, 3])
def test_a_batchs_index_key_tables_start_each_row_on_16_bytes(golden_model, requests):
    """The indexer's tables of a batch (model/layers/indexer.py, _key_tables): every run's key
    offsets, first row and row count, with each row of the run table on 16 bytes for an odd
    count of runs too (the scoring kernels are compiled for aligned pointers at warm-up)."""
    from dsflash.model.batch import SeqRun
    from dsflash.model.layers.indexer import _key_tables

    g = torch.Generator().manual_seed(7)
    pool = _pool(golden_model.config, pages=60, page_entries=4)
    source = pool.layout.sources[0]
    caches = [PagedCache(pool, golden_model.config) for _ in range(requests)]
    totals = [3 + 4 * i for i in range(requests)]
    kv, keys, packed = _random_entries(pool.layout, sum(totals), g)
    PagedCache.entries_append_runs(source, list(zip(caches, totals)), kv, keys, packed)
    runs, offset = [], 0
    for cache in caches:
        runs.append(SeqRun(cache, torch.zeros(6, dtype=torch.long), 100, [], offset=offset))
        offset += 6
    off, soff, first, count = _key_tables(runs, source, totals, torch.device("cpu"))
    assert first.tolist() == [6 * i for i in range(requests)] and count.tolist() == [6] * requests
    assert first.data_ptr() % 16 == 0 and count.data_ptr() % 16 == 0
    for r, (cache, total) in enumerate(zip(caches, totals)):
        own = cache.entry_offsets(source, torch.arange(total), kind="key")
        assert torch.equal(off[r, :total], own[0]) and torch.equal(soff[r, :total], own[1])
    for cache in caches:
        cache.release()


def test_a_batch_of_caches_stores_ring_rows_as_each_alone(golden_model):
    """The drafter's rings of a whole decode batch are written at once: slots and ring spans
    come out as with one ring_store per cache, also for more rows than the ring holds."""
    g = torch.Generator().manual_seed(6)
    pools = [_pool(golden_model.config, pages=8, slots=4, page_entries=4) for _ in range(2)]
    layout = pools[0].layout
    layer, cap, D = layout.num_ring_layers - 1, layout.ring_capacity, layout.head_dim
    alone, together = ([PagedCache(pool, golden_model.config) for _ in range(3)] for pool in pools)
    for pool in pools:  # what tensor-parallel ranks would copy (kvcache/replica.py)
        pool.writes = _WriteLog()
    for starts, counts in (([0, 5, 2], [3, cap + 2, 1]), ([3, 5 + cap + 2, 3], [6, 1, cap])):
        n = sum(counts)
        packed = (torch.randint(0, 256, (n, D), dtype=torch.uint8, generator=g),
                  torch.randint(0, 256, (n, D // 32), dtype=torch.uint8, generator=g))
        values = torch.randn(n, D, generator=g)
        PagedCache.ring_store_runs(layer, list(zip(together, starts, counts)), values, packed)
        at = 0
        for cache, start, count in zip(alone, starts, counts):
            rows, at = slice(at, at + count), at + count
            cache.ring_store(layer, start, values[rows], tuple(t[rows] for t in packed))
    assert torch.equal(pools[0].slots, pools[1].slots)
    for a, b in zip(alone, together):
        assert [(s.valid_from, s.valid_to) for s in a.ring_spans] == [(s.valid_from, s.valid_to) for s in b.ring_spans]
    assert pools[0].writes.ranges == pools[1].writes.ranges and pools[0].writes.ranges


class _WriteLog:
    def __init__(self):
        self.ranges = []

    def written(self, ranges):
        self.ranges += ranges

    def zeroed(self, ranges):
        pass


@pytest.mark.parametrize("kind", ["kv", "key"])
@pytest.mark.parametrize("several", [False, True])
@pytest.mark.parametrize("kernel", [False, True])
def test_page_offsets_follow_each_rows_table(kind, several, kernel):
    """page_offsets (one kernel launch on the GPU, torch elsewhere) and the kernel itself (the
    interpreter without a GPU) against the layout worked out entry by entry: a page's bytes,
    the section's offset and width; -1 (no entry) and -2 (past a run's own list) masked as
    sparse_attention reads them."""
    layout = CacheLayout.for_model(ModelConfig.from_dict(preset_config("tiny")), page_entries=4)
    tables = [torch.tensor([7, 2, 9]), torch.tensor([5, 0])] if several else [torch.tensor([3, 8, 1])]
    table = torch.cat(tables)
    ids = torch.tensor([[0, 5, -1, 11], [3, 4, -2, -1]]) if several else torch.tensor([[0, 5, 11, -1]])
    first = torch.tensor([[0], [3]]) if several else None
    codes_at, codes_width = layout.page_sections()[f"{kind}_codes"]
    scales_at, scales_width = layout.page_sections()[f"{kind}_scales"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    on = lambda t: None if t is None else t.to(dev)  # noqa: E731

    def lookup(entry_ids, mask):
        if kernel:
            got = page_offsets_kernel(on(table), on(entry_ids), on(first), layout.page_entries, layout.page_bytes,
                                      (codes_at, codes_width), (scales_at, scales_width), mask)
        else:
            got = page_offsets(layout, on(table), on(entry_ids), kind, first_page=on(first), mask=mask)
        return [t.cpu() for t in got]

    off, soff = lookup(ids, True)
    for r, row in enumerate(ids.tolist()):
        own = tables[r] if several else table
        for c, entry in enumerate(row):
            page = int(own[max(entry, 0) // 4]) * layout.page_bytes
            slot = max(entry, 0) % 4
            assert off[r, c] == (page + codes_at + slot * codes_width if entry >= 0 else -1)
            assert soff[r, c] == (page + scales_at + slot * scales_width if entry >= -1 else -1)
    unmasked = lookup(ids.clamp_min(0), False)
    assert torch.equal(unmasked[0][ids >= 0], off[ids >= 0]) and torch.equal(unmasked[1][ids >= -1], soff[ids >= -1])


def test_the_longest_request_a_pool_holds():
    """CachePool.longest_request: the most tokens one request can hold (what sizes a worker's
    start-up reservations), up to a limit; 0 for a pool without slots."""
    config = ModelConfig.from_dict(preset_config("tiny"))
    pool = _pool(config, pages=40)
    longest = pool.longest_request(1 << 20)
    assert pool.can_hold(longest) and not pool.can_hold(longest + 1) and 0 < longest < 1 << 20
    assert pool.longest_request(7) == 7
    assert _pool(config, slots=0).longest_request(100) == 0
