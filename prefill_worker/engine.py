"""The prefill engine: builds caches in a pool, several requests per step, chunk by chunk.

Life cycle of a request: add() -> Waiting (until a slot is free) -> Running (its chunks are
scheduled within the step's token budget; pages are reserved before each chunk runs) ->
Finished (cache complete, with the last position's logits and the DSpark taps) or Failed
(can never fit, or cancelled). A request may arrive with a cache that already holds a
prefix of its prompt (prefix reuse): only the rest is computed.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ..kvcache.paged import PagedCache
from ..kvcache.pool import CachePool, PoolExhausted
from ..model.deepseek_v41 import DeepseekV41
from ..model.kernels import fp4_moe, prefill_gemms
from ..model.logprobs import MAX_TOP
from ..model.prefill import PrefillJob, PrefillOutput, prefill_step
from ..model.runner import ced_tail_length
from .scheduler import PrefillScheduler, PrefillSchedulerConfig

log = logging.getLogger(__name__)

# warm_up's short prompts, those shorter than its chunk. 300: past the decoded attention's
# PREFILL_QUERIES (256), short of a chunk's full entry lists (512 entries: 1,024 tokens of a
# ratio-2 source, 512 of a ratio-1 one). The rest: a short prompt's rows pick its GEMMs' kernel
# and tile (fp8_gemm: the transposed kernel to 16 rows, 8 columns to 8, the bf16 weights' to 256
# rows; the tile kernel's 64-row tiles past 16), the MoE's block heights and the mHC and RoPE
# launches, and Triton specializes on a row count of 1 and on 16 dividing it. Without them a
# GPU worker's first short prompts compiled 9-23 variants, 0.06-0.65 s each (H100, fifty-eighth
# session, call AW: a 40-token prompt and `dsflash serve`'s "Hi"). Prompts of 40 and 45 tokens
# were here too until the transposed GEMM stopped specializing on its row count and on its split
# parts' stride (fp8_gemm._skinny_kernel, _outputs; a router's parts are 8 columns a row, so
# their stride had been odd in 16 at an odd count): bench/warm_up_coverage.py on the tiny
# checkpoint (sixty-first session) then found none these lengths miss at 37, 40, 41, 45, 23 or
# a 44 + 24 turn but the indexer's, which its own warm-up takes (the tool leaves that out).
# The tiny checkpoint cannot show what the release's widths compile past 300 tokens (its 4-entry
# lists are full at any length): `dsflash serve` on the bench preset's widths (H100, sixty-first
# session, call BI: bench/serving_compiles.py) compiled, after these warm-ups, at 400 tokens the
# rows attention's rotating form with an entry count 16 divides (a ratio-1 source's 400) and the
# tile GEMM at 400 rows; at 513 and 1,000 its staged form on whole queries (prompts under
# prefill_gemms.ROWS take them joined; a chunk's take them in halves) with an entry count 16
# divides and does not (512; a ratio-2 source's 500); at 1,025 and 2,000 the experts' row
# encodes at a row count of either kind (from prefill_gemms.ROWS rows, below EXPERT_PAIRS pairs
# an expert). 0.8 s for each rows-attention form on an empty cache.
SHORT_WARM_UPS = (1, 5, 8, 12, 16, 64, 300, 400, 513, 1000, 1025, 2000)
# ... and these together, one step: several prompts in a chunk gather their keys and attend in
# a form one prompt alone never takes (call BI: three prompts at once compiled it, 2.1 s).
BATCHED_WARM_UP = (50, 67, 84)


def expert_block_warm_ups(k: int, experts: int, below: int) -> list[int]:
    """The shortest prompt, under `below` tokens, of each block height fp4_moe takes for a
    prompt's routed pairs (k an input row, `experts` on this rank; one bf16 part or
    fp4_moe.SPLITS), below prefill_gemms.ROWS rows and from it (the rows arrive laid out
    otherwise). Prompts of prefill_gemms.EXPERT_PAIRS pairs an expert and more take cuBLAS.
    The literal lengths above missed one: the bench preset's 128-row blocks, from 2,048 tokens
    (256 pairs an expert) to 4,095 (H100, sixty-second session: a 3,000-token prompt compiled
    the gate/up and down kernels while serving, 2.0 s)."""
    cublas_from = -(-prefill_gemms.EXPERT_PAIRS * experts // k)
    firsts: dict[tuple, int] = {}
    for tokens in range(1, min(below, cublas_from)):
        for parts in sorted({1, fp4_moe.SPLITS}):
            key = (parts, fp4_moe.block_height(tokens * k, experts, parts), tokens >= prefill_gemms.ROWS)
            firsts.setdefault(key, tokens)
    return sorted(set(firsts.values()))


class PrefillStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class PrefillError(RuntimeError):
    """A request the engine cannot serve (too long for the pool, invalid tokens)."""


@dataclass
class PrefillRequest:
    request_id: str
    tokens: list[int]  # the whole prompt
    cache: PagedCache | None = None  # may arrive holding a prefix of `tokens`
    want_taps: bool = True
    prompt_logprobs: int | None = None  # score the prompt's tokens after its first (computed whole)
    status: PrefillStatus = PrefillStatus.WAITING
    job: PrefillJob | None = None
    output: PrefillOutput | None = None
    error: str | None = None
    created_s: float = field(default_factory=time.monotonic)
    finished_s: float | None = None

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens computed by this engine (not reused from the incoming cache)."""
        return self.job.total if self.job is not None else 0

    @property
    def remaining(self) -> int:
        if self.job is not None:
            return self.job.remaining
        held = self.cache.num_tokens if self.cache is not None else 0
        return len(self.tokens) - held


@dataclass
class PrefillEngineConfig:
    scheduler: PrefillSchedulerConfig = field(default_factory=PrefillSchedulerConfig)
    ced: bool = False  # bounded replay (approximate for long prompts); exact otherwise
    ced_tail: int | None = None


class PrefillEngine:
    def __init__(self, model: DeepseekV41, pool: CachePool, config: PrefillEngineConfig | None = None):
        self.model, self.pool = model, pool
        self.config = config or PrefillEngineConfig()
        self.scheduler = PrefillScheduler(self.config.scheduler)
        self.requests: OrderedDict[str, PrefillRequest] = OrderedDict()
        self.tail = self.config.ced_tail or ced_tail_length(model)

    # ------------------------------------------------------------ requests

    def add(self, request: PrefillRequest) -> PrefillRequest:
        vocab = self.model.config.vocab_size
        if not request.tokens:
            raise PrefillError("empty prompt")
        bad = [t for t in request.tokens if not 0 <= t < vocab]
        if bad:
            raise PrefillError(f"token ids out of range [0, {vocab}): {bad[:5]}")
        if not self.pool.can_hold(len(request.tokens)):
            raise PrefillError(f"a {len(request.tokens)}-token prompt can never fit this worker's KV pool "
                               f"({self.pool.num_pages} pages of {self.pool.layout.page_entries} entries)")
        if request.cache is not None and request.cache.num_tokens >= len(request.tokens):
            raise PrefillError("the cache already holds the whole prompt: at least one new token is needed")
        if request.prompt_logprobs is not None and not 0 <= request.prompt_logprobs <= MAX_TOP:
            raise PrefillError(f"prompt_logprobs must be in [0, {MAX_TOP}]")
        if request.prompt_logprobs is not None and request.cache is not None and request.cache.num_tokens:
            raise PrefillError("prompt logprobs score every prompt token: the prompt is computed whole, "
                               "no cached prefix")
        self.requests[request.request_id] = request
        return request

    def cancel(self, request_id: str) -> bool:
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request.cache is not None:
            request.cache.release()
        request.status, request.error = PrefillStatus.FAILED, "cancelled"
        return True

    @property
    def queued_tokens(self) -> int:
        return sum(r.remaining for r in self.requests.values())

    def has_work(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------ the step

    def step(self) -> list[PrefillRequest]:
        """One forward over the scheduled chunks; returns the requests that finished."""
        self._start_waiting()
        running = [r for r in self.requests.values() if r.status is PrefillStatus.RUNNING]
        chunks = self.scheduler.schedule([(r.request_id, r.job.next_chunk_limit) for r in running], self._reserve)
        if not chunks and running and not any(r.status is PrefillStatus.WAITING for r in self.requests.values()):
            self._relieve_memory(running)
            return []
        if chunks:
            with torch.inference_mode():
                prefill_step(self.model, [(self.requests[c.request_id].job, c.num_tokens) for c in chunks])
        done = []
        for chunk in chunks:
            request = self.requests[chunk.request_id]
            request.cache.seal_full_pages()  # while the chunk's pages are warm; a handoff sends them as is
            if request.job.finished:
                request.output, request.status = request.job.output, PrefillStatus.FINISHED
                request.finished_s = time.monotonic()
                done.append(self.requests.pop(chunk.request_id))
        return done

    def warm_up(self, tokens: int) -> int:
        """Prefill synthetic prompts of up to `tokens` tokens (what the pool can hold) and drop
        their caches: every kernel of a full chunk compiles, and a GPU that cannot hold a chunk's
        working set beside the pool fails here, at start, not on a user's prompt. Two prompts,
        of n and n - 1 tokens: Triton specializes a kernel's integer arguments on whether 16
        divides them, and the entry counts a prompt's last chunk and CED tail meet are of
        either kind (2,048 and 2,047 entries of a ratio-4 source at n = 8,192). With one kind
        compiled, the first prompt of the other paid the compiles at its end (H200: ~2 s on a
        1M-token prefill). Then the short prompts of SHORT_WARM_UPS shorter than n: their rows
        take other kernels and tiles than a chunk's, and their queries see fewer entries, for
        which the rows attention takes its rotating form (sparse_attention_gluon.STAGED_TILES, a
        compile a chunk never makes: 1.4 s on an H100), and those of expert_block_warm_ups; then
        BATCHED_WARM_UP's prompts in one step, where n holds them. Each asks for the DSpark taps,
        as the decode worker's requests do. Returns n (0: nothing ran). The engine must be idle."""
        assert not self.requests, "warm up an idle engine"
        n = tokens
        while n > 1 and not self.pool.can_hold(n):
            n //= 2
        if n < 1 or not self.pool.can_hold(n):
            return 0
        g = torch.Generator().manual_seed(0)
        steps = [[n], [n - 1]] if n > 1 else [[n]]
        config = self.model.config
        experts = len(self.model.ops.parallel.split(config.n_routed_experts))  # this rank's
        short = set(SHORT_WARM_UPS) | set(expert_block_warm_ups(config.num_experts_per_tok, experts, n - 1))
        steps += [[s] for s in sorted(short) if s < n - 1]
        if sum(BATCHED_WARM_UP) <= n:
            steps.append(list(BATCHED_WARM_UP))
        for lengths in steps:
            requests = [self.add(PrefillRequest(f"warm-up-{i}", torch.randint(
                3, config.vocab_size, (length,), generator=g).tolist())) for i, length in enumerate(lengths)]
            try:
                while any(request.status is not PrefillStatus.FINISHED for request in requests):
                    self.step()
            finally:
                for request in requests:
                    self.requests.pop(request.request_id, None)
                    if request.cache is not None:
                        request.cache.release()
        return n

    def _start_waiting(self) -> None:
        for request in self.requests.values():
            if request.status is not PrefillStatus.WAITING:
                continue
            if request.cache is None:
                if self.pool.free_slot_count == 0:
                    break  # arrival order: later requests wait too
                request.cache = PagedCache(self.pool, self.model.config)
            new = torch.tensor(request.tokens[request.cache.num_tokens:])
            ced = (self.config.ced and self.model.config.roles[self.model.config.ced_split].is_index_source
                   and request.prompt_logprobs is None)  # scoring needs every row: exact
            request.job = PrefillJob(request.cache, new, ced=ced, tail=self.tail, want_taps=request.want_taps,
                                     prompt_logprobs=request.prompt_logprobs)
            request.status = PrefillStatus.RUNNING

    def _reserve(self, request_id: str, n: int) -> bool:
        try:
            self.requests[request_id].cache.reserve(n)
            return True
        except PoolExhausted:
            return False

    def _relieve_memory(self, running: list[PrefillRequest]) -> None:
        """Every running request is blocked on pages: restart the youngest later, so the others
        can finish (its partial cache is dropped and recomputed). A lone request waits for the
        pages of finished caches still being handed off."""
        if len(running) == 1:
            return
        victim = running[-1]
        log.warning("prefill pool full: restarting %s later", victim.request_id)
        victim.cache.release()
        victim.cache, victim.job, victim.status = None, None, PrefillStatus.WAITING
        self.requests.move_to_end(victim.request_id)
