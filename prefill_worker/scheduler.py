"""Which prompt chunks run in the next prefill step.

Life cycle of a request in the prefill engine: Waiting (no memory yet) -> Running (a cache in
the pool, chunks advancing) -> Finished (handed off) or Failed. Each step takes chunks,
first come first served, until the token budget is spent; a long prompt is cut into chunks so
short requests behind it still move. The scheduler decides; it never touches tensors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    request_id: str
    num_tokens: int


# A prefill worker's tokens per step. On the H200 (2026-12-02, bench/h200.py --chunk, faithful
# mode, one machine back to back) a 1M-token prompt took 80.2 s in 16,384-token chunks and
# 84.9 s in 8,192: a longer chunk decodes each expert's weights once for twice the tokens.
# A decode worker keeps 8,192 for the prompts it recomputes (WorkerSettings): its decode
# batch waits on each chunk.
PREFILL_WORKER_TOKEN_BUDGET = 16384


@dataclass
class PrefillSchedulerConfig:
    token_budget: int = 8192  # tokens per step, over all requests
    max_chunk: int = 8192  # longest chunk of one request in one step
    max_requests_per_step: int = 16


class PrefillScheduler:
    def __init__(self, config: PrefillSchedulerConfig):
        self.config = config

    def schedule(self, remaining: list[tuple[str, int]], can_reserve) -> list[Chunk]:
        """remaining: (request id, tokens it may take this step: what is left, or its own cap) in
        arrival order; can_reserve(id, n) says whether memory for n more tokens of that request
        can be reserved now (and reserves it)."""
        budget, chunks = self.config.token_budget, []
        for request_id, left in remaining:
            if budget <= 0 or len(chunks) >= self.config.max_requests_per_step:
                break
            n = min(left, budget, self.config.max_chunk)
            if n <= 0 or not can_reserve(request_id, n):
                continue
            chunks.append(Chunk(request_id, n))
            budget -= n
        return chunks
