"""`dsflash decode`: the decode worker process.

Life cycle of a Generate call: find the conversation's best prefix (own host cache, or the
live owner's) -> reserve pool pages for the prompt's cache -> Prefill on a prefill worker,
which pulls the prefix, computes the rest and writes the cache into those pages -> the
decode engine streams tokens -> the finished turn's cache stays for the next turn. A
prefill worker that is down, a transfer that fails or arrives corrupted: the pages are
released and the prompt is recomputed here instead. The client going away aborts the
request here and, through the cancelled Prefill call, on the prefill worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import grpc
import torch
from tokenizers import Tokenizer

from ..kvcache import handoff
from ..kvcache.directory import DirectoryUnavailable, OwnershipDirectory, WorkerLoad, WorkerRole
from ..kvcache.pool import PoolExhausted
from ..logs import log_event
from ..metrics import RequestTimer
from ..model.layers import indexer
from ..model.prefill import PrefillOutput
from ..prefill_worker.engine import PrefillEngineConfig
from ..prefill_worker.scheduler import PrefillSchedulerConfig
from ..serving.engine_loop import EngineLoop
from ..serving.kernel_warm_ups import warm_up_kernels
from ..serving.logprob_protos import logprobs_from_proto
from ..serving.peers import PeerChannels
from ..serving.worker import WorkerRuntime, WorkerSettings, listening_server, serve_until_signal, warming_up
from ..v1 import worker_pb2, worker_pb2_grpc
from .conversations import Conversations, PrefixSource
from .engine import DecodeEngine, DecodeEngineConfig, DecodeError
from .request import DecodeRequest, FinishReason, TokenEvent
from .service import DecodeServicer, chunk_to_proto
from .warmup import warm_up

log = logging.getLogger("dsflash.decode")
SERVICE = "dsflash.v1.Decode"
RESERVE_WAIT_S = 30.0  # how long a prompt may wait for KV pages to free up


class DecodeWorker:
    def __init__(self, settings: WorkerSettings, directory: OwnershipDirectory | None = None, model=None,
                 metrics=None):
        self.runtime = rt = WorkerRuntime(settings, directory, metrics)
        rt.load = self.load
        rt.open("all", model)
        tokenizer = Tokenizer.from_file(f"{settings.checkpoint}/tokenizer.json")
        m = rt.metrics
        self.conversations = Conversations(settings.host_cache_bytes, rt.directory, settings.conversation_lease_s,
                                           rt.layout.fingerprint(),
                                           on_evicted=lambda _entry: m.host_cache_evictions.labels("decode").inc())
        budget = settings.prefill_token_budget
        self.engine = DecodeEngine(
            rt.model, rt.pool,
            DecodeEngineConfig(max_running=settings.max_requests, spec_tokens=settings.spec_tokens,
                               prefill=PrefillEngineConfig(PrefillSchedulerConfig(token_budget=budget, max_chunk=budget))),
            decode_text=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            on_finish=self._on_finish, reclaim=self.conversations.cache.evict)
        self._warm_up()
        self.loop = EngineLoop("decode", self._step, self.engine.has_work, self._crash,
                               device=rt.model.device, lock=rt.model.step_lock)
        rt.engine_failure = lambda: self.loop.failure
        engine, cache = self.engine, self.conversations.cache
        m.running.labels("decode").set_function(lambda: engine.num_running)
        m.waiting.labels("decode").set_function(lambda: engine.num_waiting)
        m.prefill_queue.labels("decode").set_function(lambda: engine.rebuilder.queued_tokens)
        m.host_cache_bytes.labels("decode").set_function(lambda: cache.nbytes)
        self.peers = PeerChannels()
        self.streams: dict[str, asyncio.Queue] = {}
        self._aio: asyncio.AbstractEventLoop | None = None
        self.handoff_failures = 0
        self._prefill_cache: tuple[float, list[str]] = (0.0, [])

    def _warm_up(self) -> None:
        """Compile the long contexts' indexer kernels, hold their largest top-k's work memory and
        capture the decode step's CUDA graphs now, before the worker registers (warmup.py).
        Several ranks replay the same graphs only if they captured them on the same calls, and
        the synthetic caches live on rank 0 alone: those workers capture as they serve."""
        model = self.runtime.model
        if model.device.type != "cuda":
            return
        with torch.cuda.device(model.device), warming_up():
            warm_up_kernels(model, self.runtime.pool.layout, "decode")
            if model.graphs is not None and self.runtime.ranks is None:
                warm_up(self.engine)
            budget = self.runtime.settings.prefill_token_budget
            longest = self.runtime.pool.longest_request(model.config.max_position_embeddings)
            try:  # a recomputed long prompt's top-k, after the graphs took their memory
                indexer.reserve_top_k_work(model.device, model.config, budget, longest)
            except torch.cuda.OutOfMemoryError as exc:
                raise RuntimeError(f"the indexer's top-k for {budget}-token chunks of long prompts does not fit in "
                                   f"GPU memory beside the KV pool: lower --pool-bytes or --prefill-token-budget"
                                   ) from exc

    # ------------------------------------------------------------ engine thread side

    def _step(self) -> None:
        for event in self.engine.step():
            self._dispatch(event)
        if self.engine.last_step is not None:
            elapsed_ms, emitted = self.engine.last_step
            m, k = self.runtime.metrics, self.engine.spec_tokens
            m.step.labels("decode").observe(elapsed_ms / 1000.0)
            for n in emitted:
                m.accept.labels("decode").observe(n)
            m.drafted.labels("decode").inc(k * len(emitted))
            m.accepted.labels("decode").inc(sum(min(n - 1, k) for n in emitted))

    def _dispatch(self, event: TokenEvent) -> None:
        queue = self.streams.get(event.request_id)
        if queue is not None:
            self._aio.call_soon_threadsafe(queue.put_nowait, event)

    def _crash(self, exc: BaseException) -> None:
        ids = [r.request_id for r in list(self.engine.waiting) + self.engine.running + list(self.engine.rebuilding.values())]
        for request_id in ids:
            event = self.engine.abort(request_id)
            if event is not None:
                event.finish_reason, event.error = FinishReason.ERROR, f"engine failure: {exc}"
                self._dispatch(event)

    def _on_finish(self, request: DecodeRequest) -> bool:
        """Engine thread: keep the turn's cache for its conversation. True: the request's own
        cache was kept (the engine must not release it)."""
        if not request.conversation_id or request.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return False
        if request.snapshot is not None:  # the next prompt extends the prompt minus its last token
            snapshot, request.snapshot = request.snapshot, None
            self.conversations.keep(request.conversation_id, snapshot, request.prompt[:-1])
            return False
        self.conversations.keep(request.conversation_id, request.cache, request.processed_tokens)
        return True

    # ------------------------------------------------------------ a request

    async def generate(self, request: worker_pb2.GenerateRequest, tokens: list[int], params):
        request_id = request.request_id or uuid.uuid4().hex
        began = time.monotonic()
        scored = params.prompt_logprobs is not None  # the prompt computed whole: no prefix is looked for
        source = PrefixSource(None, "none") if scored else await self.conversations.find_prefix(
            request.conversation_id, tokens)
        # history_drops_reply: the prefill stops one token short, so that the engine can keep
        # the conversation's cache as of there (DecodeEngine._split_prompt).
        split = (request.history_drops_reply and bool(request.conversation_id) and not scored
                 and source.num_tokens < len(tokens) - 1)
        try:
            cache, prefill, info = await self._prefill(request_id, tokens[:-1] if split else tokens, source,
                                                       request.prefill_address, params.prompt_logprobs)
        finally:
            self.conversations.done_with(source)
        if split:
            info["computed"] += 1  # the last prompt token, computed here either way
        decode = DecodeRequest(request_id, tokens, params, conversation_id=request.conversation_id or None,
                               cache=cache, prefill=prefill, keep_before_last=split)
        queue: asyncio.Queue = asyncio.Queue()
        self.streams[request_id] = queue
        first_token_s = None
        timer = RequestTimer(self.runtime.metrics, "decode", len(tokens))
        timer.began = began
        ended = False
        try:
            try:
                await self.loop.call(lambda: self.engine.add(decode))
            except DecodeError:
                ended = True
                if cache is not None:
                    cache.release()
                raise
            while not ended:
                event: TokenEvent = await queue.get()
                ended = event.finish_reason is not None
                if event.finish_reason is FinishReason.ERROR:
                    raise RuntimeError(event.error or "decode failed")
                if event.tokens:
                    first_token_s = first_token_s or time.monotonic()
                    timer.tokens(len(event.tokens))
                    yield chunk_to_proto(event)
        finally:
            self.streams.pop(request_id, None)
            # The client went away: a cancel lands as CancelledError while we wait, but as
            # GeneratorExit when it lands while gRPC is sending our last chunk. Either way the
            # engine must stop decoding for nobody.
            if not ended:
                self.loop.post(lambda: self.engine.abort(request_id))
        stats = decode.stats
        timer.finish(decode.finish_reason.value, info["reused"])
        ttft_ms = ((first_token_s or time.monotonic()) - began) * 1000.0
        usage = worker_pb2.Usage(prompt_tokens=len(tokens), completion_tokens=len(decode.output),
                                 cached_tokens=info["reused"], computed_tokens=info["computed"])
        yield worker_pb2.GenerateResponse(finished=worker_pb2.Finished(
            finish_reason=decode.finish_reason.value, usage=usage, stats=worker_pb2.RequestStats(
                ttft_ms=ttft_ms, average_iteration_ms=stats.average_iteration_ms,
                average_accept_length=stats.average_accept_length, decode_steps=len(stats.step_ms),
                prefill_worker=info["worker"], cache_source=info["source"], transport=info["transport"],
                transfer_ms=info["transfer_ms"], transfer_bytes=info["transfer_bytes"])))
        log_event(log, "request_end", request_id=request_id, conversation_id=request.conversation_id or "-",
                  prompt_tokens=len(tokens), cached_tokens=info["reused"], completion_tokens=len(decode.output),
                  ttft_ms=round(ttft_ms, 2), average_iteration_ms=round(stats.average_iteration_ms, 2),
                  average_accept_length=round(stats.average_accept_length, 3), finish_reason=decode.finish_reason.value,
                  cache_source=info["source"], prefill_worker=info["worker"] or "local")

    async def _prefill(self, request_id: str, tokens: list[int], source: PrefixSource, address: str,
                       prompt_logprobs: int | None = None):
        """The prompt's cache built by a prefill worker into our pages (its tokens scored where
        prompt_logprobs is set); (None, None) means recompute here (no prefill worker, or it
        failed)."""
        info = {"reused": 0, "computed": len(tokens), "worker": "", "source": "recompute", "transport": "",
                "transfer_ms": 0.0, "transfer_bytes": 0}
        address = address or await self._pick_prefill()
        if not address:
            return None, None, info
        rt = self.runtime
        cache = await self._reserve(len(tokens))
        try:
            stub = worker_pb2_grpc.PrefillStub(self.peers.get(address))
            reply = await stub.Prefill(worker_pb2.PrefillRequest(
                request_id=request_id, token_ids=tokens, prefix=source.ref,
                destination=handoff.destination(rt.transfer.endpoint(), cache, len(tokens)), want_taps=True,
                prompt_logprobs=prompt_logprobs), timeout=rt.settings.prefill_timeout_s)
            await handoff.install(cache, handoff.descriptor_from_proto(reply.descriptor), run=self.loop.call)
        except grpc.aio.AioRpcError as exc:
            cache.release()
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise DecodeError(exc.details()) from None
            if exc.code() in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNAVAILABLE):
                self.handoff_failed()
            log.warning("prefill on %s failed (%s: %s): recomputing here", address, exc.code().name, exc.details())
            return None, None, info
        except BaseException:
            cache.release()
            raise
        if prompt_logprobs is not None and len(reply.prompt_logprobs) != len(tokens) - 1:
            # a prefill worker of an older version does not score: the prompt is computed here
            cache.release()
            log.warning("prefill on %s sent %d prompt scores for %d tokens: recomputing here", address,
                        len(reply.prompt_logprobs), len(tokens))
            return None, None, info
        logits = torch.frombuffer(bytearray(reply.last_logits), dtype=torch.float32)
        taps = None
        if reply.taps_rows:
            taps = torch.frombuffer(bytearray(reply.taps), dtype=torch.int16).view(torch.bfloat16)
            taps = taps.reshape(reply.taps_rows, reply.taps_width)
        rt.record_transfer(reply.transfer_bytes, reply.transfer_ms / 1000.0, reply.transport)
        info.update(reused=reply.reused_tokens, computed=reply.computed_tokens, worker=address,
                    source=source.kind if reply.reused_tokens else "none", transport=reply.transport,
                    transfer_ms=reply.transfer_ms, transfer_bytes=reply.transfer_bytes)
        device = rt.model.device
        taps = None if taps is None else taps.to(device)
        scored = logprobs_from_proto(reply.prompt_logprobs) if prompt_logprobs is not None else None
        return cache, PrefillOutput(logits=logits.to(device), taps=taps, taps_start=reply.taps_start,
                                    prompt_logprobs=scored), info

    async def _reserve(self, num_tokens: int):
        """Pages for an incoming cache; evicts kept conversations, then waits for running ones."""
        rt = self.runtime
        deadline = time.monotonic() + RESERVE_WAIT_S
        while True:
            try:
                return handoff.reserve(rt.pool, rt.model.config, num_tokens)
            except PoolExhausted:
                need = rt.layout.pages_for(num_tokens) * rt.layout.page_bytes + rt.layout.slot_bytes
                if self.conversations.cache.evict(need) > 0:
                    continue
                if time.monotonic() > deadline:
                    raise asyncio.TimeoutError from None
                await asyncio.sleep(0.05)

    async def _pick_prefill(self) -> str:
        static = list(self.runtime.settings.prefill_workers)
        if static:
            return static[0]
        now = time.monotonic()
        if now - self._prefill_cache[0] > 1.0:
            try:
                workers = await self.runtime.directory.list_workers(WorkerRole.PREFILL)
                workers.sort(key=lambda w: w.load.num_queued_prefill_tokens)
                # A degraded directory answers from this process's own state, which holds no
                # prefill workers: keep the last list (a dead one fails its RPC -> recompute).
                if workers or not self.runtime.directory_degraded():
                    self._prefill_cache = (now, [w.address for w in workers])
            except DirectoryUnavailable:
                pass
        return self._prefill_cache[1][0] if self._prefill_cache[1] else ""

    async def cancel(self, request_id: str) -> bool:
        event = await self.loop.call(lambda: self.engine.abort(request_id))
        if event is not None:
            self._dispatch(event)
        return event is not None

    # ------------------------------------------------------------ status

    def handoff_failed(self) -> None:
        self.handoff_failures += 1
        self.runtime.record_transfer_failure()

    def load(self) -> WorkerLoad:
        pool = self.runtime.pool
        return WorkerLoad(num_running_requests=self.engine.num_running + self.engine.num_waiting,
                          free_kv_bytes=pool.free_page_count * pool.layout.page_bytes)

    def status(self) -> worker_pb2.WorkerStatus:
        rt, pool = self.runtime, self.runtime.pool
        rebuilt = self.engine.rebuilder
        return worker_pb2.WorkerStatus(
            worker_id=rt.worker_id, role="decode", incarnation=rt.incarnation, endpoint=rt.transfer.endpoint(),
            total_pages=pool.num_pages, free_pages=pool.free_page_count, total_slots=pool.num_slots,
            free_slots=pool.free_slot_count, queued_prefill_tokens=rebuilt.queued_tokens,
            running_requests=self.engine.num_running, waiting_requests=self.engine.num_waiting,
            host_cache_bytes=self.conversations.cache.nbytes, host_cache_entries=len(self.conversations.cache),
            handoff_failures_total=self.handoff_failures,
            directory_degraded=rt.directory_degraded(), draining=rt.draining)

    # ------------------------------------------------------------ serving

    async def start(self) -> tuple[grpc.aio.Server, int]:
        self._aio = asyncio.get_running_loop()
        self.loop.start()
        server, port = listening_server(self.runtime.settings)
        worker_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(self), server)
        self.runtime.add_standard_services(server, [SERVICE])
        await server.start()
        await self.runtime.start(server, port, [SERVICE])
        self.conversations.bind(self.runtime.worker_id, self.runtime.incarnation, self.runtime.address, self._aio)
        self.server = server
        return server, port

    async def drain(self) -> None:
        await self.runtime.drain(self.server, lambda: len(self.streams), [SERVICE])

    async def close(self) -> None:
        if getattr(self, "server", None) is not None:
            await self.server.stop(grace=None)
        self.loop.stop()
        self.conversations.cache.clear()
        await self.peers.close()
        await self.runtime.close()


async def serve(settings: WorkerSettings) -> None:
    worker = DecodeWorker(settings)
    server, _ = await worker.start()
    try:
        await serve_until_signal(server, worker.drain)
    finally:
        await worker.close()
