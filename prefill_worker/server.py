"""`dsflash prefill`: the prefill worker process."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import torch

from ..kvcache import handoff
from ..kvcache.directory import OwnershipDirectory, WorkerLoad
from ..kvcache.pool import PoolExhausted
from ..logs import log_event
from ..model.layers import indexer
from ..serving.engine_loop import EngineLoop
from ..serving.kernel_warm_ups import warm_up_kernels
from ..serving.peers import PeerChannels
from ..serving.worker import WorkerRuntime, WorkerSettings, listening_server, serve_until_signal, warming_up
from ..v1 import worker_pb2, worker_pb2_grpc
from .engine import PrefillEngine, PrefillEngineConfig, PrefillRequest
from .scheduler import PrefillSchedulerConfig
from .service import PrefillServicer

log = logging.getLogger("dsflash.prefill")
SERVICE = "dsflash.v1.Prefill"


class PrefillWorker:
    def __init__(self, settings: WorkerSettings, directory: OwnershipDirectory | None = None, model=None,
                 metrics=None):
        self.runtime = WorkerRuntime(settings, directory, metrics)
        self.runtime.load = self.load
        self.runtime.open("prefill", model)
        budget = settings.prefill_token_budget
        self.engine = PrefillEngine(self.runtime.model, self.runtime.pool, PrefillEngineConfig(
            PrefillSchedulerConfig(token_budget=budget, max_chunk=budget), ced=settings.ced))
        model = self.runtime.model
        if model.device.type == "cuda":  # before the worker registers: no long prompt waits on these compiles
            with torch.cuda.device(model.device), warming_up():
                warm_up_kernels(model, self.runtime.pool.layout, "prefill")
                self._warm_up_chunk(budget)
        self.loop = EngineLoop("prefill", self._step, self.engine.has_work, self._crash,
                               device=model.device, lock=model.step_lock)
        self.runtime.engine_failure = lambda: self.loop.failure
        m, engine = self.runtime.metrics, self.engine
        m.prefill_queue.labels("prefill").set_function(lambda: engine.queued_tokens)
        m.running.labels("prefill").set_function(
            lambda: sum(r.status.value == "running" for r in list(engine.requests.values())))
        m.waiting.labels("prefill").set_function(
            lambda: sum(r.status.value == "waiting" for r in list(engine.requests.values())))
        self.peers = PeerChannels()
        self._waiters: dict[str, asyncio.Future] = {}
        self._aio: asyncio.AbstractEventLoop | None = None
        self.computed_tokens_total = 0
        self.reused_tokens_total = 0
        self.handoff_failures = 0

    def _warm_up_chunk(self, tokens: int) -> None:
        """One full chunk through the engine before the worker registers (PrefillEngine.warm_up),
        then the indexer's largest top-k (reserve_top_k_work: a long prompt's, which an empty
        cache's chunk never meets): the first user's prompt then waits on no compile, and a pool
        that leaves no room for a chunk's working set is reported now."""
        model = self.runtime.model
        longest = self.runtime.pool.longest_request(model.config.max_position_embeddings)
        start = time.monotonic()
        try:
            # the chunk beside the long prompts' top-k work, as a long prompt's chunks meet them
            held = torch.empty(indexer.top_k_work_bytes(model.config, tokens, longest), dtype=torch.uint8,
                               device=model.device)
            n = self.engine.warm_up(tokens)
            del held
            indexer.reserve_top_k_work(model.device, model.config, tokens, longest)
        except torch.cuda.OutOfMemoryError as exc:
            raise RuntimeError(f"a {tokens}-token prefill chunk (with a long prompt's top-k work) does not fit in "
                               f"GPU memory beside the KV pool: lower --pool-bytes, --prefill-token-budget or "
                               f"--weight-cache-bytes") from exc
        log_event(log, "prefill_warm_up", tokens=n, seconds=round(time.monotonic() - start, 2))

    # ------------------------------------------------------------ engine thread side

    def _step(self) -> None:
        for done in self.engine.step():
            self._settle(done)

    def _settle(self, done: PrefillRequest) -> None:
        future = self._waiters.pop(done.request_id, None)

        def deliver():
            if future is None or future.done():
                if done.cache is not None:  # the caller went away: nobody else will free it
                    done.cache.release()
                return
            future.set_result(done)

        self._aio.call_soon_threadsafe(deliver)

    def _crash(self, exc: BaseException) -> None:
        for request_id in list(self.engine.requests):
            request = self.engine.requests[request_id]
            self.engine.cancel(request_id)
            request.error = f"engine failure: {exc}"
            self._settle(request)

    # ------------------------------------------------------------ asyncio side

    async def run(self, job: PrefillRequest) -> PrefillRequest:
        """Queue a prefill and wait for it; cancellation (client gone) cancels it in the engine."""
        future = asyncio.get_running_loop().create_future()
        self._waiters[job.request_id] = future
        try:
            await self.loop.call(lambda: self.engine.add(job))
        except Exception:
            self._waiters.pop(job.request_id, None)
            if job.cache is not None:
                job.cache.release()
            raise
        try:
            return await future
        except asyncio.CancelledError:
            self.loop.post(lambda: self.engine.cancel(job.request_id))
            raise

    async def cancel(self, request_id: str) -> bool:
        found = await self.loop.call(lambda: self.engine.cancel(request_id))
        future = self._waiters.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()
        return bool(found)

    async def import_prefix(self, ref: worker_pb2.CacheRef, tokens: list[int]):
        """Pull a prefix cache from the worker holding it; None (compute from scratch) on any failure."""
        n = ref.descriptor.num_tokens
        if not ref.handle or not ref.worker_address or not 0 < n < len(tokens):
            return None
        rt = self.runtime
        try:
            cache = handoff.reserve(rt.pool, rt.model.config, n)
        except PoolExhausted:
            log.warning("no room to import a %d-token prefix: computing it", n)
            return None
        try:
            stub = worker_pb2_grpc.DecodeStub(self.peers.get(ref.worker_address))
            reply = await stub.PushCache(worker_pb2.PushCacheRequest(
                handle=ref.handle, destination=handoff.destination(rt.transfer.endpoint(), cache, n),
                expected_fingerprint=rt.layout.fingerprint()), timeout=rt.settings.transfer_timeout_s)
            desc = handoff.descriptor_from_proto(reply.descriptor)
            if desc.num_tokens != n or list(desc.history) != tokens[:n][-len(desc.history):]:
                raise ValueError("the prefix cache does not hold this prompt's first tokens")
            await handoff.install(cache, desc, run=self.loop.call)
            return cache
        except (grpc.aio.AioRpcError, ValueError) as exc:
            cache.release()
            log.warning("prefix import from %s failed (%s): computing it", ref.worker_address,
                        exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else exc)
            return None
        except BaseException:  # cancelled (the caller went away), or the staging copy failed
            cache.release()
            raise

    def count(self, done: PrefillRequest, pushed) -> None:
        self.computed_tokens_total += done.computed_tokens
        self.reused_tokens_total += len(done.tokens) - done.computed_tokens
        m = self.runtime.metrics
        m.prompt_tokens.labels("prefill").inc(len(done.tokens))
        m.computed_tokens.labels("prefill").inc(done.computed_tokens)
        m.cached_tokens.labels("prefill").inc(len(done.tokens) - done.computed_tokens)
        m.duration.labels("prefill").observe((done.finished_s or done.created_s) - done.created_s)
        self.runtime.record_transfer(pushed.bytes, pushed.seconds, pushed.transport)

    def handoff_failed(self) -> None:
        self.handoff_failures += 1
        self.runtime.record_transfer_failure()

    def load(self) -> WorkerLoad:
        pool = self.runtime.pool
        return WorkerLoad(num_queued_prefill_tokens=self.engine.queued_tokens,
                          num_running_requests=len(self.engine.requests),
                          free_kv_bytes=pool.free_page_count * pool.layout.page_bytes)

    def status(self) -> worker_pb2.WorkerStatus:
        rt, pool = self.runtime, self.runtime.pool
        return worker_pb2.WorkerStatus(
            worker_id=rt.worker_id, role="prefill", incarnation=rt.incarnation, endpoint=rt.transfer.endpoint(),
            total_pages=pool.num_pages, free_pages=pool.free_page_count, total_slots=pool.num_slots,
            free_slots=pool.free_slot_count, queued_prefill_tokens=self.engine.queued_tokens,
            running_requests=len(self.engine.requests), computed_prefill_tokens_total=self.computed_tokens_total,
            reused_prefill_tokens_total=self.reused_tokens_total, handoff_failures_total=self.handoff_failures,
            directory_degraded=rt.directory_degraded(), draining=rt.draining)

    # ------------------------------------------------------------ serving

    async def start(self) -> tuple[grpc.aio.Server, int]:
        self._aio = asyncio.get_running_loop()
        self.loop.start()
        server, port = listening_server(self.runtime.settings)
        worker_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(self), server)
        self.runtime.add_standard_services(server, [SERVICE])
        await server.start()
        await self.runtime.start(server, port, [SERVICE])
        self.server = server
        return server, port

    async def drain(self) -> None:
        await self.runtime.drain(self.server, lambda: len(self._waiters), [SERVICE])

    async def close(self) -> None:
        if getattr(self, "server", None) is not None:
            await self.server.stop(grace=None)
        self.loop.stop()
        await self.peers.close()
        await self.runtime.close()


async def serve(settings: WorkerSettings) -> None:
    worker = PrefillWorker(settings)
    server, _ = await worker.start()
    try:
        await serve_until_signal(server, worker.drain)
    finally:
        await worker.close()

