"""The decode engine: continuous batching with DSpark speculative blocks.

Life cycle of a request: add() -> Waiting (needs a slot; or needs its cache rebuilt here,
e.g. after preemption) -> Running -> Finished. A request arriving from a prefill worker
brings its cache and the last prompt position's logits: its first token is drawn from those.
Each step, for every running request at once:
  1. DSpark drafts k tokens after the pending token y (sampled per request);
  2. one target forward verifies [y, d1..dk] for the whole batch;
  3. each request accepts a prefix and one target token (greedy match or rejection sampling),
     rolls its cache back to the accepted tokens, and feeds the accepted positions' taps to
     the DSpark rings.
Requests join and leave between steps. A full pool preempts the youngest request (its cache
is dropped and rebuilt later, its output so far kept); a request that can never fit fails.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..kvcache.pool import CachePool, PoolExhausted
from ..model.batch import SeqRun
from ..model.deepseek_v41 import DeepseekV41
from ..model.device import HostCopy, to_device
from ..model.dspark import DSparkDrafter, greedy_chooser
from ..prefill_worker.engine import PrefillEngine, PrefillEngineConfig, PrefillRequest
from .request import DecodeRequest, DecodeStatus, FinishReason, TokenEvent
from .sampling import RequestSampler
from .spec import accept_block, accept_greedy, greedy_targets
from .stops import StopStringMatcher, finish_reason

log = logging.getLogger(__name__)


class DecodeError(ValueError):
    """A request this engine can never serve."""


@dataclass
class DecodeEngineConfig:
    max_running: int = 32
    spec_tokens: int = 5  # drafts verified per step; 0 = one token per step, no drafter
    prefill: PrefillEngineConfig = field(default_factory=PrefillEngineConfig)  # local rebuilds


class DecodeEngine:
    def __init__(self, model: DeepseekV41, pool: CachePool, config: DecodeEngineConfig | None = None,
                 decode_text: Callable[[list[int]], str] | None = None,
                 on_finish: Callable[[DecodeRequest], bool] | None = None,
                 reclaim: Callable[[int], int] | None = None):
        self.model, self.pool = model, pool
        self.config = config or DecodeEngineConfig()
        c = model.config
        self.spec_tokens = min(self.config.spec_tokens, c.dspark_block_size) if c.num_dspark_stages else 0
        self.drafter = DSparkDrafter(model) if c.num_dspark_stages else None
        self.rebuilder = PrefillEngine(model, pool, self.config.prefill)
        self.decode_text = decode_text
        self.on_finish = on_finish  # True: it kept the finished request's cache
        self.reclaim = reclaim  # frees up to n bytes of kept caches (conversation LRU); returns bytes freed
        self.waiting: deque[DecodeRequest] = deque()
        self.running: list[DecodeRequest] = []
        self.rebuilding: dict[str, DecodeRequest] = {}
        self.last_step: tuple[float, list[int]] | None = None  # (ms, tokens emitted per request) of the last block

    # ------------------------------------------------------------ requests

    def add(self, request: DecodeRequest) -> None:
        c = self.model.config
        if any(not 0 <= t < c.vocab_size for t in request.prompt):
            raise DecodeError(f"prompt token ids must be in [0, {c.vocab_size})")
        need = len(request.prompt) + request.params.max_tokens + self.spec_tokens + 1
        if not self.pool.can_hold(need):
            raise DecodeError(f"prompt ({len(request.prompt)}) + max_tokens ({request.params.max_tokens}) "
                              f"can never fit this worker's KV pool")
        if request.sampler is None:
            request.sampler = RequestSampler(request.params, request.prompt, c.vocab_size, c.eos_token_id)
        if request.stop_matcher is None and request.params.stop and self.decode_text is not None:
            request.stop_matcher = StopStringMatcher(self.decode_text, request.params.stop)
        if request.keep_before_last:
            self._split_prompt(request)
        request.status = DecodeStatus.WAITING
        self.waiting.append(request)

    def _split_prompt(self, request: DecodeRequest) -> None:
        """The cache holds the prompt but its last token: copy it for the conversation (with
        the drafter's state of those positions), and let the rebuilder compute that token."""
        request.keep_before_last = False
        cache, prefill = request.cache, request.prefill
        if cache is None or cache.num_tokens != len(request.prompt) - 1:
            return
        if self.drafter is not None and prefill is not None and prefill.taps is not None:
            with torch.inference_mode():
                self.drafter.absorb(cache, prefill.taps_start, prefill.taps.float())
        for _ in range(2):  # a second try after evicting older kept caches
            try:
                request.snapshot = cache.copy_to(self.pool)
                break
            except PoolExhausted:
                if self.reclaim is None or self.reclaim(cache.pool_bytes) <= 0:
                    break
        if request.snapshot is None:
            log.info("no pool room to keep %s before its last prompt token", request.request_id)
        request.prefill = None

    def abort(self, request_id: str) -> TokenEvent | None:
        for request in list(self.waiting) + self.running + list(self.rebuilding.values()):
            if request.request_id == request_id:
                if request_id in self.rebuilding:
                    self.rebuilder.cancel(request_id)
                    del self.rebuilding[request_id]
                    request.cache = None
                if request in self.waiting:
                    self.waiting.remove(request)
                return self._finish(request, FinishReason.ABORT, [])
        return None

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.rebuilding)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.rebuilding)

    # ------------------------------------------------------------ the step

    def step(self) -> list[TokenEvent]:
        self.last_step = None
        events: list[TokenEvent] = []
        self._admit(events)
        if self.rebuilder.has_work():
            for done in self.rebuilder.step():
                request = self.rebuilding.pop(done.request_id)
                request.cache, request.prefill = done.cache, done.output
                self.waiting.appendleft(request)
            self._admit(events)
        if self.running:
            self._decode(events)
        return events

    def _admit(self, events: list[TokenEvent]) -> None:
        for request in list(self.waiting):
            if request.cache is None or request.cache.num_tokens < request.num_processed_tokens:
                if not self._make_room(request):
                    break  # first come, first served: later requests wait too
                self.waiting.remove(request)
                self._rebuild(request)
                continue
            if len(self.running) >= self.config.max_running:
                break
            self.waiting.remove(request)
            self._start(request, events)

    def _room_for(self, request: DecodeRequest) -> bool:
        """Can the request's cache be built (on from the part it holds) without taking pages the
        running requests need for their next block? (Without this check a rebuilt request would
        evict the others again.) A cache it holds already has its slot."""
        block = self.spec_tokens + 1
        headroom = sum(r.cache.pages_needed(block) for r in self.running)
        headroom += sum(self.pool.layout.pages_for(r.num_processed_tokens + block) for r in self.rebuilding.values())
        held = request.cache
        if held is None:
            need = self.pool.layout.pages_for(request.num_processed_tokens + block)
        else:
            need = held.pages_needed(request.num_processed_tokens - held.num_tokens + block)
        return (held is not None or self.pool.free_slot_count > 0) and self.pool.free_page_count - headroom >= need

    def _make_room(self, request: DecodeRequest) -> bool:
        """_room_for, evicting kept conversation caches (the least recent first) while it is not:
        kept caches that fill the pool's slots or pages would otherwise leave it waiting forever."""
        while not self._room_for(request):
            if self.reclaim is None or self.reclaim(self.pool.layout.page_bytes) <= 0:
                return False
        return True

    def _rebuild(self, request: DecodeRequest) -> None:
        request.status = DecodeStatus.PREFILLING
        self.rebuilding[request.request_id] = request
        cache, request.cache = request.cache, None  # the rebuilder owns a partial cache now
        scored = request.params.prompt_logprobs if request.pending is None else None  # a fresh request's
        if scored is not None and cache is not None:  # scoring computes the prompt whole
            cache.release()
            cache = None
        self.rebuilder.add(PrefillRequest(request.request_id, request.processed_tokens, cache=cache,
                                          want_taps=self.drafter is not None, prompt_logprobs=scored))

    def _start(self, request: DecodeRequest, events: list[TokenEvent]) -> None:
        prefill = request.prefill
        if self.drafter is not None and prefill.taps is not None:
            with torch.inference_mode():
                self.drafter.absorb(request.cache, prefill.taps_start, prefill.taps.float())
        request.status = DecodeStatus.RUNNING
        if request.pending is None:  # fresh: the first token comes from the prompt's last logits
            token, _ = request.sampler.choose(prefill.logits)
            request.stats.first_token_s = time.monotonic()
            event = self._event(request, *self._append(request, [token], prefill.logits.unsqueeze(0)))
            event.prompt_logprobs = prefill.prompt_logprobs
            events.append(event)
            if event.finish_reason is not None:
                return
        request.prefill = None
        self.running.append(request)

    def _append(self, request: DecodeRequest, tokens: list[int], rows: torch.Tensor):
        """Append tokens to the output, stopping at the first that ends the request; rows[i] are
        the target logits that chose tokens[i]. Returns (kept tokens, their logprobs, reason)."""
        params, kept, logprobs, reason = request.params, [], [], None
        for i, token in enumerate(tokens):
            kept.append(token)
            request.output.append(token)
            if params.logprobs:
                logprobs.append(request.sampler.logprob(rows[i], token))
            reason = finish_reason(params, self.model.config.eos_token_id, len(request.output), token,
                                   request.stop_matcher)
            if reason is not None:
                break
        request.sampler.record(kept)
        request.logprobs += logprobs
        request.pending = kept[-1]
        return kept, logprobs, reason

    def _event(self, request: DecodeRequest, kept: list[int], logprobs, reason) -> TokenEvent:
        if reason is not None:
            return self._finish(request, reason, kept, logprobs)
        return TokenEvent(request.request_id, kept, logprobs if request.params.logprobs else None)

    def _finish(self, request: DecodeRequest, reason: FinishReason, tokens: list[int],
                logprobs=None, error: str | None = None) -> TokenEvent:
        request.status, request.finish_reason, request.error = DecodeStatus.FINISHED, reason, error
        request.stats.finished_s = time.monotonic()
        if request in self.running:
            self.running.remove(request)
        kept = self.on_finish(request) if (self.on_finish and request.cache is not None and reason is not FinishReason.ABORT) else False
        if request.cache is not None and not kept:
            request.cache.release()
        if request.snapshot is not None:  # on_finish did not take it
            request.snapshot.release()
        request.cache = request.snapshot = None
        return TokenEvent(request.request_id, tokens, logprobs if request.params.logprobs else None, reason, error)

    def _ensure_memory(self) -> None:
        """Reserve pages for one more block per running request, preempting the youngest when full."""
        k = self.spec_tokens + 1
        for request in list(self.running):
            while request in self.running:
                try:
                    request.cache.reserve(k)
                    break
                except PoolExhausted:
                    if self.reclaim is None or self.reclaim(self.pool.layout.page_bytes * k) <= 0:
                        self._preempt(self.running[-1])

    def _preempt(self, request: DecodeRequest) -> None:
        log.warning("KV pool full: preempting %s (its cache is rebuilt later)", request.request_id)
        self.running.remove(request)
        request.cache.release()
        request.cache, request.prefill = None, None
        request.status = DecodeStatus.WAITING
        request.stats.preemptions += 1
        self.waiting.append(request)

    def _decode(self, events: list[TokenEvent]) -> None:
        self._ensure_memory()
        batch = list(self.running)
        if not batch:
            return
        began = time.perf_counter()
        k = self.spec_tokens
        drafts: list[list[int]] = [[] for _ in batch]
        dists: list[list[torch.Tensor]] = [[] for _ in batch]
        with torch.inference_mode():
            block = None  # greedy: the verify blocks [R, k+1] on the device
            if k and all(r.sampler.plain_greedy for r in batch):
                # argmax on the device row by row; the host waits once, for the whole block, and
                # only when the forward needs the drafts (its first layers are enqueued by then)
                proposal = self.drafter.propose([(r.cache, r.pending) for r in batch], greedy_chooser)
                pending = to_device(torch.tensor([[r.pending] for r in batch]), proposal.drafts.device)
                block = torch.cat([pending, proposal.drafts[:, :k]], 1)
            elif k:
                def choose(i: int, rows: torch.Tensor) -> list[int]:
                    plain = greedy_targets([r.sampler for r in batch], list(rows[:, None]))
                    tokens = []
                    for j, request in enumerate(batch):
                        if j in plain:
                            token, dist = plain[j][0], None  # greedy requests need no draft distribution
                        else:
                            token, dist = request.sampler.choose(rows[j], drafts[j])
                        if i < k:
                            drafts[j].append(token)
                            dists[j].append(dist)
                        tokens.append(token)
                    return tokens

                self.drafter.propose([(r.cache, r.pending) for r in batch], choose)
            runs = _verify_runs(batch, drafts, block)
            result = self.model.forward(runs, logits="all", taps=self.drafter is not None)
            if block is not None:
                drafts = runs[0].host.get()[:, 1:].tolist()
            targets = greedy_targets([r.sampler for r in batch], result.logits)
            outcomes, cuts = [], []
            for j, (request, run) in enumerate(zip(batch, runs)):
                request.cache.commit(run.host_tokens().tolist())
                logits = result.logits[j]
                if j in targets:
                    emitted = accept_greedy(targets[j], drafts[j])
                else:
                    emitted = accept_block(request.sampler, logits, drafts[j],
                                           None if request.params.greedy else dists[j])
                kept, logprobs, reason = self._append(request, emitted, logits)
                # The cache keeps y and the accepted drafts before the last kept token.
                cuts.append((request.cache, run.start + len(kept)))
                request.stats.accepted.append(len(kept))
                outcomes.append((request, kept, logprobs, reason))
            type(batch[0].cache).truncate_many(cuts)
            if self.drafter is not None:  # one absorb for the batch, before a finish releases a cache
                self.drafter.absorb_many([(request.cache, run.start, result.taps[j][:len(kept)])
                                          for j, ((request, kept, _, _), run) in enumerate(zip(outcomes, runs))])
            events += [self._event(*outcome) for outcome in outcomes]
        elapsed_ms = (time.perf_counter() - began) * 1000.0
        for request in batch:
            request.stats.step_ms.append(elapsed_ms)
        self.last_step = (elapsed_ms, [r.stats.accepted[-1] for r in batch])


def _verify_runs(batch: list[DecodeRequest], drafts: list[list[int]], block: torch.Tensor | None) -> list[SeqRun]:
    """Each request's verify block [pending, drafts..]: from the host's lists, or the rows of
    `block` on the device, their host copy started now (SeqRun.host)."""
    if block is None:
        return [SeqRun(cache=r.cache, tokens=torch.tensor([r.pending] + drafts[j]), start=r.cache.num_tokens,
                       history=list(r.cache.history)) for j, r in enumerate(batch)]
    host = HostCopy(block)
    return [SeqRun(cache=r.cache, tokens=block[j], start=r.cache.num_tokens, history=list(r.cache.history), host=host,
                   host_row=j) for j, r in enumerate(batch)]
