"""A decode worker that streams a scripted token sequence: the gateway's tests use it for
behaviour a random model cannot show, and bench/gateway_overhead.py to time the relay alone."""

from __future__ import annotations

import asyncio

import grpc

from ..v1 import worker_pb2, worker_pb2_grpc


class ScriptedDecode(worker_pb2_grpc.DecodeServicer):
    """script(request) -> (list of token-id chunks, finish_reason) or raises grpc-style errors."""

    def __init__(self, script, delay_s: float = 0.0, on_send=None):
        self.script, self.delay_s, self.on_send = script, delay_s, on_send
        self.requests: list[worker_pb2.GenerateRequest] = []
        self.cancelled: list[str] = []
        self.recomputes = False  # report the prompt computed here, not by the prefill worker asked for

    async def Generate(self, request, context):
        self.requests.append(request)
        result = self.script(request)
        if isinstance(result, tuple) and isinstance(result[0], grpc.StatusCode):
            await context.abort(*result)
        chunks, reason = result
        sent = 0
        try:
            for chunk in chunks:
                if isinstance(chunk, grpc.StatusCode):  # fail mid-stream
                    await context.abort(chunk, "scripted failure")
                logprobs = [worker_pb2.TokenLogprob(token_id=t, logprob=-0.5,
                                                    top=[worker_pb2.TopLogprob(token_id=t, logprob=-0.5)])
                            for t in chunk] if request.sampling.logprobs else []
                # asked for, the first chunk scores the prompt's tokens after its first (logprob -1, rank 2)
                scored = [worker_pb2.TokenLogprob(token_id=t, logprob=-1.0, rank=2, top=[
                    worker_pb2.TopLogprob(token_id=t, logprob=-0.5)] * request.sampling.prompt_logprobs)
                    for t in request.token_ids[1:]] if request.sampling.HasField("prompt_logprobs") and not sent else []
                if self.on_send is not None:
                    self.on_send(request.request_id, sent)
                yield worker_pb2.GenerateResponse(chunk=worker_pb2.TokenChunk(token_ids=chunk, logprobs=logprobs,
                                                                              prompt_logprobs=scored))
                sent += len(chunk)
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
            yield worker_pb2.GenerateResponse(finished=worker_pb2.Finished(
                finish_reason=reason, usage=worker_pb2.Usage(prompt_tokens=len(request.token_ids),
                                                             completion_tokens=sent, cached_tokens=3),
                stats=worker_pb2.RequestStats(prefill_worker="" if self.recomputes else request.prefill_address,
                                              transport="scripted")))
        except (asyncio.CancelledError, GeneratorExit):
            # a cancel that finds this generator waiting in its sleep arrives as CancelledError;
            # one that finds it at a yield (its message being sent) ends the call's task there,
            # and the generator closes after (GeneratorExit): a loaded CI machine met the second
            self.cancelled.append(request.request_id)
            raise
