"""Engine fixtures: pools, a request factory, a plain-greedy oracle and a scripted drafter."""

from __future__ import annotations

import pytest
import torch

from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig
from dsflash.decode_worker.request import DecodeRequest
from dsflash.decode_worker.sampling import SamplingParams
from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.pool import CachePool
from dsflash.model.dspark import Proposal
from dsflash.model.runner import greedy


def make_pool(model, pages=600, slots=16, page_entries=16):
    return CachePool(CacheLayout.for_model(model.config, page_entries=page_entries), num_pages=pages, num_slots=slots)


def greedy_request(rid, prompt, max_tokens=16, **kw):
    return DecodeRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw))


def run_to_end(engine, requests, add_at=None, max_steps=500):
    """Run the engine; request i joins at step add_at[i] (default 0). Returns {id: request}."""
    add_at = add_at or [0] * len(requests)
    pending = sorted(zip(add_at, range(len(requests))))
    by_id, step = {}, 0
    while (pending or engine.has_work()) and step < max_steps:
        while pending and pending[0][0] <= step:
            r = requests[pending.pop(0)[1]]
            engine.add(r)
            by_id[r.request_id] = r
        engine.step()
        step += 1
    assert not engine.has_work(), "engine did not drain"
    return by_id


class ScriptedDrafter:
    """A drafter double: proposes the true greedy continuation with deliberate mistakes, so
    verification accepts 0..k drafts and rolls back at every position over a run."""

    def __init__(self, engine: DecodeEngine, truth: dict[str, list[int]], block: int):
        self.engine, self.truth, self.block = engine, truth, block
        self.calls = 0

    def absorb(self, cache, start, taps):
        pass

    def absorb_many(self, items):
        pass

    def propose(self, requests, choose):
        self.calls += 1
        vocab = self.engine.model.config.vocab_size
        logits = torch.zeros(len(requests), self.block, vocab)
        for j, (cache, y) in enumerate(requests):
            req = next(r for r in self.engine.running if r.cache is cache)
            ref = self.truth[req.request_id]
            base = len(req.prompt) + len(req.output)  # index in ref of the token after y
            for i in range(self.block):
                want = ref[base + i] if base + i < len(ref) else 0
                if (self.calls * 7 + j * 3 + i * 5) % 4 == 0:  # a deliberate mistake
                    want = (want + 1 + i) % vocab
                logits[j, i, want] = 30.0
        # row by row, as the drafter does; a chooser answers host ints or a tensor
        drafts = [torch.as_tensor(choose(i, logits[:, i])) for i in range(self.block)]
        return Proposal(torch.stack(drafts, dim=1), logits, torch.ones(len(requests), self.block))


@pytest.fixture
def oracle():
    """Plain greedy (one target forward per token, dense cache): what every request must get."""
    cache = {}

    def run(model, prompt, n):
        key = (id(model), tuple(prompt), n)
        if key not in cache:
            with torch.inference_mode():
                cache[key] = greedy(model, torch.tensor(prompt), n)
        return cache[key]

    return run


def engine_with(model, pool, spec=5, **kw):
    return DecodeEngine(model, pool, DecodeEngineConfig(spec_tokens=spec, **kw))
