"""What rank 0 pays to announce a call to its other ranks (model/lockstep.py), on the host.

Per call, rank 0 builds a view of each cache (the pages it gained since its last view),
pickles the call and writes it into one pipe per rank; a rank reads, unpickles and rebuilds
its caches from the views. Measured with the `bench` preset's cache layout (release widths,
64 entries per page) for a batch of caches at a context length: the first call sends whole
page tables, later ones only what grew. The limit printed beside each figure is the decode
step it rides on (one H200, 4K: 41.6 ms at batch 1, 91.2 ms at batch 8, docs/performance.md).
No GPU and no process group: the bytes written outside forwards go over NCCL, not measured here.

    python bench/lockstep_cpu.py [--batches 1 8 32] [--contexts 4096 1048576]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
from types import SimpleNamespace

import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.pool import CachePool
from dsflash.kvcache.replica import CacheViews
from dsflash.kvcache.state import RingSpan
from dsflash.model.batch import SeqRun
from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from dsflash.model.lockstep import Leader

STEP_MS = {1: 41.6, 8: 91.2}


def fake_cache(pool, config, layout: CacheLayout, slot: int, context: int, first_page: int):
    """The bookkeeping of a `context`-token cache, pages numbered from first_page (no bytes)."""
    tables, page = {}, first_page
    for source, count in layout.entries_for(context).items():
        n = -(-count // layout.page_entries)
        tables[source] = list(range(page, page + n))
        page += n
    return SimpleNamespace(pool=pool, slot=slot, serial=slot, page_table=tables,
                           counts=layout.entries_for(context), tail_lengths={s: 0 for s in layout.tail_offsets()},
                           num_tokens=context, history=list(range(64)),
                           ring_spans=[RingSpan(context - 128, context) for _ in range(config.num_all_layers)]), page


def measure(config: ModelConfig, layout: CacheLayout, batch: int, context: int, calls: int = 5) -> dict:
    ours, theirs = mp.Pipe()
    follower_pool = CachePool(layout, 1, batch)  # views reference pages by id only
    views = CacheViews(follower_pool, config)
    received = []

    def follower():
        import pickle

        while True:
            message = theirs.recv_bytes()
            began = time.perf_counter()
            call = pickle.loads(message)
            if call.kind == "stop":
                return
            for view in call.views:
                views.open(view)
            received.append((time.perf_counter() - began, len(message)))

    reader = threading.Thread(target=follower)
    reader.start()
    leader = Leader([ours], "cpu")
    leader.attach(SimpleNamespace(writes=None, buffer=None))
    caches, page = [], 0
    for slot in range(batch):
        cache, page = fake_cache(leader.pool, config, layout, slot, context, page)
        caches.append(cache)
    sent = []
    for _ in range(calls):
        runs = [SeqRun(cache=c, tokens=torch.arange(6), start=c.num_tokens, history=c.history) for c in caches]
        began = time.perf_counter()
        with leader.announce("forward", runs, logits="all", taps=True):
            pass
        sent.append(time.perf_counter() - began)
    leader.stop()
    reader.join()
    return {"first_ms": sent[0] * 1e3, "steady_ms": min(sent[1:]) * 1e3,
            "rank_first_ms": received[0][0] * 1e3, "rank_steady_ms": min(r[0] for r in received[1:]) * 1e3,
            "first_KB": received[0][1] / 1e3, "steady_KB": received[-1][1] / 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 1 << 20])
    args = parser.parse_args()
    config = ModelConfig.from_dict(preset_config("bench"))
    layout = CacheLayout.for_model(config, page_entries=64)
    for context in args.contexts:
        for batch in args.batches:
            r = measure(config, layout, batch, context)
            limit = f"{STEP_MS[batch]} ms step" if batch in STEP_MS else "no step measured"
            print(f"ctx {context:>8} B{batch:<3} rank 0: first {r['first_ms']:7.2f} ms, then {r['steady_ms']:6.3f} ms; "
                  f"a rank: first {r['rank_first_ms']:7.2f} ms, then {r['rank_steady_ms']:6.3f} ms; "
                  f"message {r['first_KB']:8.1f} KB, then {r['steady_KB']:6.1f} KB  (vs {limit})")


if __name__ == "__main__":
    main()
