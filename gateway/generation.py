"""Relaying one OpenAI request's choices from decode workers.

Each choice is one Decode.Generate stream (n > 1 runs n streams at once, a batch of prompts n
a prompt, numbered on from one prompt's to the next's, as OpenAI numbers them). Its tokens go
through a streaming detokenizer (UTF-8 boundaries, stop strings, which end the stream early)
and, for chat, the output parser (reasoning vs content, DSML tool calls). Updates are
yielded in arrival order; closing the generator cancels every stream, which aborts the
request on the decode and prefill workers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from ..v1 import worker_pb2, worker_pb2_grpc
from . import special_tokens as st
from .detokenizer import StreamingDetokenizer
from .errors import APIError, from_grpc
from .output_parser import OutputParser
from .parser_output import ParsedMessage
from .replies import ReplyMemory
from .router import Route
from .tokenizer import Tokenizer


@dataclass
class GenerationSpec:
    request_id: str
    prompt: list[int]
    sampling: worker_pb2.SamplingParams
    n: int
    route: Route
    stops: list[str] = field(default_factory=list)
    chat: bool = True
    starts_in_reasoning: bool = False
    tools_enabled: bool = False
    forced_text: str = ""  # output the prompt already forced (a tool call's opening): primes the parser
    timeout_s: float = 3600.0
    first_index: int = 0  # its first choice's index in the reply (a batch's later prompts)
    max_tool_calls: int | None = None  # parallel_tool_calls: false: the first call only
    hide_output: bool = False  # max_tokens 0 (echo): the workers' one token is not the client's

    @property
    def reply_in_reasoning(self) -> bool:
        """The workers' tokens begin as reasoning: thinking, unless the prompt forced a tool call
        (whose opening, after an empty reasoning's `</think>`, is the prompt's)."""
        return self.chat and self.starts_in_reasoning and not self.forced_text

    @property
    def history_drops_reply(self) -> bool:
        """Thinking without tools: the next turn's history drops this reply's reasoning, so it
        extends the prompt minus its closing `<think>`, not the reply (chat_encoding._render)."""
        return self.chat and self.starts_in_reasoning and not self.tools_enabled and not self.forced_text


@dataclass
class Choice:
    index: int
    detok: StreamingDetokenizer
    parser: OutputParser | None
    starts_in_reasoning: bool = False
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[worker_pb2.TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[worker_pb2.TokenLogprob] = field(default_factory=list)  # where asked: tokens 2..n
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    finished: worker_pb2.Finished | None = None
    message: ParsedMessage | None = None
    hides_output: bool = False  # GenerationSpec.hide_output: no token, text or logprob, finish "length"
    reasoning_ends: int | None = None  # the reply's length through its first `</think>`, once generated

    @property
    def reasoning_tokens(self) -> int:
        return self.reasoning_tokens_in(len(self.token_ids))

    def reasoning_tokens_in(self, n: int) -> int:
        """The reasoning tokens (`</think>` included) among the reply's first n."""
        if not self.starts_in_reasoning:
            return 0
        return n if self.reasoning_ends is None else min(n, self.reasoning_ends)

    def extend(self, tokens: list[int], logprobs: list[worker_pb2.TokenLogprob]) -> None:
        if self.reasoning_ends is None and st.THINK_END.id in tokens:
            self.reasoning_ends = len(self.token_ids) + tokens.index(st.THINK_END.id) + 1
        self.token_ids += tokens
        self.logprobs += logprobs


@dataclass
class Update:
    choice: Choice
    tokens: list[int]
    text: str
    delta: dict | None  # chat: the OpenAI delta of this update (None when nothing to send)
    logprobs: list[worker_pb2.TokenLogprob]
    done: bool
    reply_tokens: int = field(init=False, default=0)  # the reply's length at this update (its choice goes on)

    def __post_init__(self):
        self.reply_tokens = len(self.choice.token_ids)


class DecodeClients:
    def __init__(self, channels):
        self.channels = channels

    def generate(self, address: str, request: worker_pb2.GenerateRequest, timeout_s: float):
        return worker_pb2_grpc.DecodeStub(self.channels.get(address)).Generate(request, timeout=timeout_s)


async def relay(specs: list[GenerationSpec], clients: DecodeClients, tokenizer: Tokenizer,
                replies: ReplyMemory | None = None):
    """Async generator of Updates for every choice of every spec (a request's prompts); raises
    APIError if a worker fails. The first choice's chat reply goes into `replies`, for the next
    turn that quotes it."""
    queue: asyncio.Queue = asyncio.Queue()
    calls, tasks, choices = {}, [], {}
    requests = {index: (spec, _generate_request(spec, index)) for spec in specs
                for index in range(spec.first_index, spec.first_index + spec.n)}  # all made before any starts
    open_choices = len(requests)
    try:
        for index, (spec, request) in requests.items():
            choices[index] = _choice(spec, index, tokenizer)
            calls[index] = clients.generate(spec.route.decode, request, spec.timeout_s)
            tasks.append(asyncio.create_task(_pump(index, calls[index], queue)))
        for spec in specs:
            if spec.forced_text:
                for index in range(spec.first_index, spec.first_index + spec.n):
                    delta = choices[index].parser.feed(spec.forced_text)
                    yield Update(choices[index], [], "", delta.to_openai() if delta else None, [], done=False)
        while open_choices:
            index, message, error = await queue.get()
            choice = choices[index]
            if choice.finish_reason is not None:
                continue  # (a stream this relay cancelled at a stop string may end in an error)
            if error is not None:
                raise error
            update = _apply(choice, message)
            if update.done:
                open_choices -= 1
                calls[index].cancel()  # no-op once the stream ended; stops it after a stop string
                if replies is not None and index == 0 and specs[0].chat and not specs[0].forced_text:
                    await _remember(replies, tokenizer, choice)
            yield update
    finally:
        for call in calls.values():
            call.cancel()
        for task in tasks:
            task.cancel()


def _choice(spec: GenerationSpec, index: int, tokenizer: Tokenizer) -> Choice:
    stop_after = st.THINK_END.id if spec.reply_in_reasoning else None
    detok = StreamingDetokenizer(tokenizer, spec.stops, stop_after_token=stop_after,
                                 min_tokens=spec.sampling.min_tokens)
    parser = OutputParser(starts_in_reasoning=spec.starts_in_reasoning, tools_enabled=spec.tools_enabled,
                          max_calls=spec.max_tool_calls) if spec.chat else None
    return Choice(index, detok, parser, spec.reply_in_reasoning, hides_output=spec.hide_output)


def _generate_request(spec: GenerationSpec, index: int) -> worker_pb2.GenerateRequest:
    sampling = worker_pb2.SamplingParams()
    sampling.CopyFrom(spec.sampling)
    if spec.sampling.HasField("seed"):
        # a prompt's j-th choice draws from seed + j, wherever the prompt stands in a batch (wrapped
        # into int64, as the seed field holds it)
        sampling.seed = (spec.sampling.seed + index - spec.first_index + 2**63) % 2**64 - 2**63
    return worker_pb2.GenerateRequest(
        request_id=f"{spec.request_id}-{index}", token_ids=spec.prompt, sampling=sampling,
        # only the first choice continues the conversation: n siblings would overwrite each other
        conversation_id=spec.route.conversation_id if index == spec.first_index else "",
        prefill_address=spec.route.prefill, history_drops_reply=spec.history_drops_reply)


async def _pump(index: int, call, queue: asyncio.Queue) -> None:
    try:
        async for message in call:
            await queue.put((index, message, None))
        await queue.put((index, None, None))
    except asyncio.CancelledError:
        raise
    except grpc.aio.AioRpcError as exc:
        # CANCELLED too: a worker that ends a stream so (shutting down) must not leave the
        # client waiting; where this relay cancelled it, the choice had finished (skipped)
        await queue.put((index, None, from_grpc(exc)))


async def _remember(replies: ReplyMemory, tokenizer: Tokenizer, choice: Choice) -> None:
    """The reply's ids under the text a next turn quotes; the renderer writes the EOS itself.
    (Only choice 0 continues the conversation, and a forced call's opening was prompt, not
    reply, so neither is remembered.)"""
    ids = choice.token_ids
    if ids and ids[-1] == st.EOS.id:
        ids = ids[:-1]
    await replies.publish(tokenizer.decode(ids), ids)


def _apply(choice: Choice, message: worker_pb2.GenerateResponse | None) -> Update:
    if message is None:  # the stream ended without a Finished message
        raise APIError(502, "the decode worker closed the stream early", type="server_error")
    if message.HasField("finished"):
        choice.finished = message.finished
        return _finish(choice, message.finished.finish_reason, [], [])
    tokens, logprobs, text = [], [], []
    if message.chunk.prompt_logprobs:  # the first chunk's
        choice.prompt_logprobs = list(message.chunk.prompt_logprobs)
    if choice.hides_output:
        return Update(choice, [], "", None, [], done=False)
    for i, token in enumerate(message.chunk.token_ids):
        text.append(choice.detok.push(token))
        tokens.append(token)
        if i < len(message.chunk.logprobs):
            logprobs.append(message.chunk.logprobs[i])
        if choice.detok.is_stopped:  # the update keeps its tokens and logprobs, as the whole reply does
            choice.extend(tokens, logprobs)
            return _finish(choice, "stop", tokens, logprobs, "".join(text))
    choice.extend(tokens, logprobs)
    piece = "".join(text)
    choice.text.append(piece)
    delta = _delta(choice, piece)
    if choice.parser is not None and choice.parser.dropped_calls:
        # parallel_tool_calls: false and a second call began: nothing after it reaches the client,
        # so the stream ends here (and the relay cancels the worker's), as at a stop string
        update = _finish(choice, "stop", tokens, logprobs)
        update.text, update.delta = piece + update.text, _merge(delta, update.delta)
        return update
    return Update(choice, tokens, piece, delta, logprobs, done=False)


def _finish(choice: Choice, reason: str, tokens, logprobs, text: str = "") -> Update:
    text += choice.detok.finish()
    choice.text.append(text)
    delta = _delta(choice, text) if text else None
    if choice.parser is not None:
        last, choice.message = choice.parser.finish()
        delta = _merge(delta, last.to_openai() if last else None)
        # a call dropped by parallel_tool_calls: false may have run out of tokens; the kept one is whole
        if choice.message.has_tool_calls and (reason == "stop" or choice.parser.dropped_calls):
            reason = "tool_calls"
    choice.finish_reason = "length" if choice.hides_output else reason
    return Update(choice, tokens, text, delta, logprobs, done=True)


def _delta(choice: Choice, text: str) -> dict | None:
    if choice.parser is None or not text:
        return None
    delta = choice.parser.feed(text)
    return delta.to_openai() if delta else None


def _merge(a: dict | None, b: dict | None) -> dict | None:
    if not a:
        return b
    if not b:
        return a
    out = dict(a)
    for key, value in b.items():
        if key in ("content", "reasoning_content") and key in out:
            out[key] = (out[key] or "") + (value or "")
        elif key == "tool_calls" and key in out:
            out[key] = out[key] + value
        else:
            out[key] = value
    return out
