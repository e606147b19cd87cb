"""The decode gRPC service: adapts protos, streams tokens; the worker does the orchestration."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from ..kvcache import handoff
from ..kvcache.transport import ChecksumMismatch, TransferError
from ..serving.logprob_protos import logprobs_to_proto
from ..serving.worker import admit_tokens
from ..v1 import worker_pb2, worker_pb2_grpc
from .engine import DecodeError
from .sampling import SamplingError, SamplingParams

log = logging.getLogger(__name__)


def sampling_from_proto(msg: worker_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens or 16, temperature=msg.temperature, top_p=msg.top_p or 1.0, top_k=msg.top_k,
        min_p=msg.min_p, repetition_penalty=msg.repetition_penalty or 1.0, presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty, seed=msg.seed if msg.HasField("seed") else None,
        stop_token_ids=tuple(msg.stop_token_ids), stop=tuple(msg.stop), ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs, top_logprobs=msg.top_logprobs, min_tokens=msg.min_tokens,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        logit_bias=tuple(sorted(msg.logit_bias.items())))


def chunk_to_proto(event) -> worker_pb2.GenerateResponse:
    return worker_pb2.GenerateResponse(chunk=worker_pb2.TokenChunk(
        token_ids=event.tokens, logprobs=logprobs_to_proto(event.logprobs),
        prompt_logprobs=logprobs_to_proto(event.prompt_logprobs)))


class DecodeServicer(worker_pb2_grpc.DecodeServicer):
    def __init__(self, worker):
        self.worker = worker

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        w = self.worker
        tokens = await admit_tokens(w.runtime, request.token_ids, context)
        try:
            params = sampling_from_proto(request.sampling)
        except SamplingError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            # aclosing: a cancelled call closes the inner generator now, not when it is collected
            async with contextlib.aclosing(w.generate(request, tokens, params)) as messages:
                async for message in messages:
                    yield message
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no KV memory became free in time")

    async def Cancel(self, request, context):
        return worker_pb2.CancelReply(found=await self.worker.cancel(request.request_id))

    async def PushCache(self, request: worker_pb2.PushCacheRequest, context: grpc.aio.ServicerContext):
        w = self.worker
        if request.expected_fingerprint and request.expected_fingerprint != w.runtime.layout.fingerprint():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "incompatible KV cache layout")
        entry = w.conversations.cache.pin(request.handle)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such cache here (evicted or never held)")
        try:
            pushed = await handoff.push(w.runtime.transfer, entry.cache, request.destination,
                                        w.runtime.settings.transfer_timeout_s, run=w.loop.call)
            w.runtime.record_transfer(pushed.bytes, pushed.seconds, pushed.transport)
            return worker_pb2.PushCacheReply(descriptor=handoff.descriptor_to_proto(entry.cache.descriptor()),
                                             transfer_bytes=pushed.bytes, transfer_ms=pushed.seconds * 1000.0,
                                             transport=pushed.transport)
        except ChecksumMismatch as exc:
            w.handoff_failed()
            await context.abort(grpc.StatusCode.DATA_LOSS, f"cache push corrupted: {exc}")
        except (TransferError, ValueError) as exc:
            w.handoff_failed()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cache push failed: {exc}")
        finally:
            w.conversations.cache.unpin(entry)

    async def Status(self, request, context):
        return self.worker.status()
