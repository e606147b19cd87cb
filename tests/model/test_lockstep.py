"""Rank 0's side of the lockstep protocol, in one process (model/lockstep.py, kvcache/replica.py).
The protocol across real processes is tests/tiers/test_ranks.py."""

from __future__ import annotations

import threading

import pytest
import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool
from dsflash.kvcache.replica import CacheViews, PoolWrites
from dsflash.model.lockstep import Leader
from dsflash.model.runner import step


def test_writes_outside_a_forward_are_kept_and_coalesced():
    writes = PoolWrites()
    writes.written([("pages", 0, 10), ("pages", 10, 5), ("slots", 100, 4)])
    writes.zeroed([("slots", 0, 64)])
    with writes.computing():  # a forward's writes: every rank makes them itself
        writes.written([("pages", 500, 8)])
    elsewhere = threading.Thread(target=lambda: writes.written([("pages", 40, 2)]))
    with writes.computing():  # ... but only this thread's: a transfer lands on another
        elsewhere.start()
        elsewhere.join()
    assert writes.take() == ([("slots", 0, 64)], [("pages", 0, 15), ("pages", 40, 42), ("slots", 100, 104)])
    assert writes.take() == ([], [])


def test_views_rebuild_a_cache_in_another_pool_sending_only_new_pages(tiny_model):
    layout = CacheLayout.for_model(tiny_model.config, page_entries=2)
    pools = [CachePool(layout, 256, 4) for _ in range(2)]
    pools[1].follows_rank0 = True
    sender, receiver = CacheViews(), CacheViews(pools[1], tiny_model.config)
    cache = PagedCache(pools[0], tiny_model.config)
    sent = {s: 0 for s in cache.page_table}
    for tokens in (torch.arange(5, 45), torch.tensor([7, 8, 9]), torch.arange(50, 70)):
        cache.reserve(len(tokens))  # as the engines do before a forward: a follower allocates nothing
        for segment, start, length in cache.byte_ranges():  # the bytes rank 0 would broadcast
            pools[1].buffer(segment)[start:start + length] = pools[0].buffer(segment)[start:start + length]
        view = sender.view(cache)
        copy = receiver.open(view)
        assert pools[1].free_slot_count == 4 and pools[1].free_page_count == 256  # allocated nothing
        assert copy.byte_ranges() == cache.byte_ranges() and copy.descriptor() == cache.descriptor()
        with torch.inference_mode():
            got = step(tiny_model, [copy], [tokens], logits="all").logits[0]
            want = step(tiny_model, [cache], [tokens], logits="all").logits[0]
        assert torch.equal(got, want)
        assert view.known == sent  # after the first view, only the pages added since
        sent = {s: len(t) for s, t in cache.page_table.items()}
    with pytest.raises(RuntimeError, match="reserves every page"):
        with torch.inference_mode():
            step(tiny_model, [receiver.open(sender.view(cache))], [torch.arange(300)])
    # the slot's next holder is a new cache: its view starts its tables afresh
    cache.release()
    again = PagedCache(pools[0], tiny_model.config, slot=cache.slot)
    assert sender.view(again).known == {s: 0 for s in again.page_table}
    stale = sender.view(cache)
    stale.known = {s: 1 for s in stale.known}
    with pytest.raises(RuntimeError, match="rank 0 sent pages"):
        receiver.open(stale)


def test_a_call_that_fails_on_rank_0_ends_the_worker(tiny_model):
    failed = []
    leader = Leader([], "cpu", on_failure=lambda: failed.append(True))
    pool = CachePool(CacheLayout.for_model(tiny_model.config, page_entries=8), 16, 2)
    leader.attach(pool)
    cache = PagedCache(pool, tiny_model.config)
    with pytest.raises(RuntimeError, match="boom"):
        with leader.announce("forward", [_run(cache)]):
            raise RuntimeError("boom")
    assert failed == [True]
    with leader.announce("forward", [_run(cache)]):
        pass
    assert failed == [True]


def _run(cache):
    from dsflash.model.batch import SeqRun

    return SeqRun(cache=cache, tokens=torch.tensor([1, 2]), start=cache.num_tokens, history=[])
