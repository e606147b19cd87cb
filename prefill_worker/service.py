"""The prefill gRPC service: adapts protos and queues requests; the engine runs in its thread.

Life cycle of a Prefill call: validate -> (pull the prefix cache from its holder, if any; on
any failure compute from scratch) -> queue in the engine -> wait for the cache -> push it into
the caller's reserved ranges (verified there) -> reply with its descriptor, the last logits
and the DSpark taps. The cache is released on every path out: success, failure, cancel.
"""

from __future__ import annotations

import logging
import time

import grpc
import torch

from ..kvcache import handoff
from ..kvcache.transport import ChecksumMismatch, TransferError
from ..serving.logprob_protos import logprobs_to_proto
from ..serving.worker import admit_tokens
from ..v1 import worker_pb2, worker_pb2_grpc
from .engine import PrefillError, PrefillRequest, PrefillStatus

log = logging.getLogger(__name__)


class PrefillServicer(worker_pb2_grpc.PrefillServicer):
    def __init__(self, worker):
        self.worker = worker

    async def Prefill(self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext):
        w = self.worker
        tokens = await admit_tokens(w.runtime, request.token_ids, context)
        if not request.HasField("destination") or not request.destination.ranges:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no destination for the cache")
        began = time.perf_counter()
        scored = request.prompt_logprobs if request.HasField("prompt_logprobs") else None
        # A scored prompt is computed whole: a prefix's rows would have no logits.
        reuse = request.HasField("prefix") and scored is None
        prefix = await w.import_prefix(request.prefix, tokens) if reuse else None
        job = PrefillRequest(request.request_id, tokens, cache=prefix, want_taps=request.want_taps,
                             prompt_logprobs=scored)
        try:
            done = await w.run(job)
        except PrefillError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if done.status is not PrefillStatus.FINISHED:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, done.error or "prefill failed")
        prefill_ms = (time.perf_counter() - began) * 1000.0
        try:
            pushed = await handoff.push(w.runtime.transfer, done.cache, request.destination,
                                        w.runtime.settings.transfer_timeout_s, run=w.loop.call)
        except ChecksumMismatch as exc:
            w.handoff_failed()
            await context.abort(grpc.StatusCode.DATA_LOSS, f"KV handoff corrupted: {exc}")
        except (TransferError, ValueError) as exc:
            w.handoff_failed()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"KV handoff failed: {exc}")
        finally:
            done.cache.release()
        w.count(done, pushed)
        out = done.output
        taps = out.taps.to('cpu', torch.bfloat16).contiguous() if out.taps is not None else None
        return worker_pb2.PrefillReply(
            descriptor=handoff.descriptor_to_proto(done.cache.descriptor()),
            last_logits=out.logits.to('cpu', torch.float32).contiguous().numpy().tobytes(),
            taps=taps.view(torch.int16).numpy().tobytes() if taps is not None else b"",
            taps_start=out.taps_start, taps_rows=taps.shape[0] if taps is not None else 0,
            taps_width=taps.shape[1] if taps is not None else 0,
            computed_tokens=done.computed_tokens, reused_tokens=len(tokens) - done.computed_tokens,
            prefill_ms=prefill_ms, transfer_ms=pushed.seconds * 1000.0, transfer_bytes=pushed.bytes,
            transport=pushed.transport, prompt_logprobs=logprobs_to_proto(out.prompt_logprobs))

    async def Cancel(self, request, context):
        found = await self.worker.cancel(request.request_id)
        return worker_pb2.CancelReply(found=found)

    async def Status(self, request, context):
        return self.worker.status()
