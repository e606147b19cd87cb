"""POST /v1/chat/completions and POST /v1/completions.

Life cycle of a request: auth and body limits (app.py) -> parse and validate -> render and
tokenize (chat encoding, off the event loop) -> context-length check -> route (conversation
owner / prefix match, least loaded) -> relay the decode workers' token streams as SSE chunks
or one JSON body. A client that goes away cancels the streams, which aborts the request on
both tiers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from ..serving.logprob_protos import most_scored_tokens
from ..v1 import worker_pb2
from . import responses as R
from . import special_tokens as st
from .chat_encoding import EncodedChat, encode_chat, encode_segments
from .chat_errors import ChatEncodingError
from .dsml import forced_call_opening
from .segments import SegmentBuilder, spell
from .errors import APIError, invalid
from .generation import DecodeClients, GenerationSpec, relay
from .replies import ReplyMemory
from .response_store import MemoryResponseStore
from .responses_items import ChatForm
from .router import NoWorkers, Router
from .schema import (MAX_CHOICES, ChatCompletionRequest, ChatPrompt, CompletionRequest, DetokenizeRequest,
                     SamplingFields, TokenizeChat, TokenizeText)
from .tokenizer import Tokenizer

log = logging.getLogger("dsflash.gateway")


@dataclass(frozen=True)
class GatewaySettings:
    model_name: str = "deepseek-v4.1-flash"
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 64 << 20
    max_context_tokens: int = 1_048_576
    default_max_tokens: int = 4096
    keepalive_s: float = 15.0
    request_timeout_s: float = 3600.0
    health_generate_timeout_s: float = 60.0  # the canary's bound (it queues behind real requests)
    reasoning_field: str = "reasoning_content"  # DeepSeek's and SGLang's name; vLLM's is "reasoning"; or "both"


@dataclass
class Context:
    settings: GatewaySettings
    router: Router
    tokenizer: Tokenizer
    clients: DecodeClients
    metrics: Any
    replies: ReplyMemory = field(default_factory=ReplyMemory)  # generated ids of recent replies
    responses: Any = field(default_factory=MemoryResponseStore)  # the Responses API's stored responses
    canary: asyncio.Future | None = None  # /health_generate's, while one runs


async def read_body(request: Request, model: type[BaseModel] | Callable[[dict], type[BaseModel]], limit: int):
    """The request's JSON body as `model` (or as the model `model(body)` picks), or a 4xx."""
    raw = await request.body()
    if len(raw) > limit:
        raise APIError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    try:
        data = json.loads(raw.decode("utf-8"))  # (json.loads would take UTF-16 and -32 bodies too)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise invalid(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid("the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) and _holds_lone_surrogate(data):
        raise invalid("a string in the body holds an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF alone): it "
                      "is not text", code="invalid_unicode")
    if not isinstance(model, type):
        model = model(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_from(exc) from None


def invalid_from(exc: ValidationError) -> APIError:
    """A 400 naming the first field pydantic refused."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"] if not _is_union_tag(p)) or None
    return invalid(f"{param}: {first['msg']}" if param else first["msg"], param=param)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
# a surrogate's escape (its UTF-8 bytes fail the body's decode); a body without one is not walked
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _holds_lone_surrogate(data) -> bool:
    """JSON lets a string escape half a UTF-16 pair; Python keeps it as a code point that no
    UTF-8 encoder takes, so a field holding one (a user name, metadata, a conversation id)
    would fail where it is written out: in a reply, a log line or a gRPC message."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _is_union_tag(part) -> bool:
    """pydantic names the union member in error locations ("prompt.str"); OpenAI's `param` does not."""
    return isinstance(part, str) and ("[" in part or part in _TYPE_TAGS)


def sampling_proto(ctx: Context, req: SamplingFields, max_tokens: int, logprobs: bool, top_logprobs: int,
                   prompt_logprobs: int | None = None) -> worker_pb2.SamplingParams:
    if req.min_tokens > max_tokens:
        raise invalid(f"min_tokens ({req.min_tokens}) is more than the {max_tokens} tokens this request may generate",
                      param="min_tokens")
    params = worker_pb2.SamplingParams(
        max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0),
        min_p=req.min_p, repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos,
        logprobs=logprobs, top_logprobs=top_logprobs, min_tokens=req.min_tokens)
    if req.seed is not None:
        params.seed = req.seed
    if prompt_logprobs is not None:
        params.prompt_logprobs = prompt_logprobs
    if req.logit_bias:
        _check_vocab(ctx, list(req.logit_bias), "logit_bias")
        params.logit_bias.update(req.logit_bias)
    return params


_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def client_request_id(request: Request) -> str | None:
    """The client's X-Request-Id (a proxy's, to find the request by), where it is a plain id."""
    client = request.headers.get("x-request-id", "")
    return client if _CLIENT_REQUEST_ID.fullmatch(client) else None


def request_id_of(request: Request, prefix: str) -> str:
    """Our id of a request, which the workers log and the reply carries: with the client's id in
    it where one came, and always unique (two clients may send the same one, and the workers key
    their streams by it)."""
    client = client_request_id(request)
    return f"{prefix}-{client}-{uuid.uuid4().hex[:8]}" if client else f"{prefix}-{uuid.uuid4().hex}"


def _check_scored(prompts: list[list[int]], top: int | None, param: str) -> None:
    """Prompt scores (top alternatives each) travel in one gRPC message: a prompt too long for it
    gets a 400 here, not a failed prefill and a recompute."""
    if top is None:
        return
    most = most_scored_tokens(top)
    if any(len(p) > most for p in prompts):
        raise invalid(f"a prompt's scores with {top} alternatives each fit at most {most} tokens; this prompt has "
                      f"{max(len(p) for p in prompts)}: ask for fewer alternatives", param=param)


def conversation_of(request: Request, req: SamplingFields, continued: str | None = None) -> str | None:
    """The conversation a request continues, by the most specific name it gives: the header or
    `conversation_id`, the stored response it continues (`continued`), its `user`. (Not
    OpenAI's `prompt_cache_key`: many requests that share a prefix share it, and one
    conversation holds one cache, so it would pin them to one worker and reuse nothing the
    prefix match does not.)"""
    return request.headers.get("x-conversation-id") or req.conversation_id or continued or req.user or None


def budget(ctx: Context, prompt_len: int, asked: int | None, param: str) -> int:
    room = ctx.settings.max_context_tokens - prompt_len
    if asked is None:
        asked = min(ctx.settings.default_max_tokens, room)
    if asked < 1 or prompt_len + asked > ctx.settings.max_context_tokens:
        raise invalid(f"this model's context is {ctx.settings.max_context_tokens} tokens; the prompt has {prompt_len} "
                      f"and {asked} more were asked for", param=param, code="context_length_exceeded")
    return asked


async def route(ctx: Context, conversation: str | None, prompt: list[int]):
    try:
        return await ctx.router.route(conversation, prompt)
    except NoWorkers as exc:
        raise APIError(503, str(exc), type="service_unavailable", code="no_workers") from None


async def health_generate(ctx: Context) -> JSONResponse:
    """A canary: one greedy token of a one-token prompt through a prefill and a decode worker, as
    SGLang's /health_generate does. Readiness sees registered workers; this sees a wedged engine,
    or a prefill tier the decode worker had to do without (it recomputes the prompt itself, and
    says so in the reply's stats). Probes that arrive together share one canary; no
    conversation keeps its cache."""
    if ctx.canary is None or ctx.canary.done():
        ctx.canary = asyncio.ensure_future(_canary(ctx))
    ok, body = await asyncio.shield(ctx.canary)  # one probe hanging up leaves the others' canary running
    return JSONResponse(body, status_code=200 if ok else 503)


async def _canary(ctx: Context) -> tuple[bool, dict]:
    began, choice = time.monotonic(), None
    try:
        async with asyncio.timeout(ctx.settings.health_generate_timeout_s):
            to = replace(await ctx.router.route(None, [st.BOS.id]), conversation_id="")
            spec = GenerationSpec(request_id=f"health-{uuid.uuid4().hex}", prompt=[st.BOS.id], n=1, route=to,
                                  chat=False, timeout_s=ctx.settings.health_generate_timeout_s,
                                  sampling=worker_pb2.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            async for update in relay([spec], ctx.clients, ctx.tokenizer):
                choice = update.choice
    except (NoWorkers, APIError, TimeoutError) as exc:
        return False, _canary_failed("timed out" if isinstance(exc, TimeoutError) else str(exc))
    stats = choice.finished.stats if choice is not None and choice.finished is not None else None
    if stats is None or not stats.prefill_worker:
        return False, _canary_failed(f"the decode worker {to.decode} computed the prompt itself: the prefill "
                                     f"worker {to.prefill or '(none)'} failed it or was unreachable (see its log)")
    return True, {"status": "ok", "decode_worker": to.decode, "prefill_worker": stats.prefill_worker,
                  "transport": stats.transport, "ms": round((time.monotonic() - began) * 1000.0, 1)}


def _canary_failed(reason: str) -> dict:
    return APIError(503, f"the canary generation failed: {reason}", type="service_unavailable").body()


# ------------------------------------------------------------------ vLLM's tokenizer endpoints


async def tokenize(ctx: Context, request: Request) -> dict:
    """The ids a completion of `prompt`, or a chat completion of `messages` (the same rendering
    options), would send: `count` is its usage's prompt_tokens."""
    req = await read_body(request, lambda body: TokenizeChat if "messages" in body else TokenizeText,
                          ctx.settings.max_body_bytes)
    loop = asyncio.get_running_loop()  # long texts: off the event loop, as every stream's relay runs on it
    if isinstance(req, TokenizeChat):
        ids = (await chat_prompt(ctx, req))[0]
    else:
        ids = await loop.run_in_executor(None, lambda: ctx.tokenizer.encode_text(req.prompt))
    strs = None
    if req.return_token_strs:
        strs = await loop.run_in_executor(None, lambda: [R.token_text(ctx.tokenizer, t) for t in ids])
    return {"count": len(ids), "max_model_len": ctx.settings.max_context_tokens, "tokens": ids, "token_strs": strs}


async def detokenize(ctx: Context, request: Request) -> dict:
    req = await read_body(request, DetokenizeRequest, ctx.settings.max_body_bytes)
    if len(req.tokens) > ctx.settings.max_context_tokens:
        raise invalid(f"at most {ctx.settings.max_context_tokens} tokens (the model's context)", param="tokens")
    _check_vocab(ctx, req.tokens, "tokens")
    text = await asyncio.get_running_loop().run_in_executor(None, lambda: ctx.tokenizer.decode(req.tokens))
    return {"prompt": text}


def _check_vocab(ctx: Context, ids: list[int], param: str) -> None:
    vocab = ctx.tokenizer.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise invalid(f"token ids must be in [0, {vocab}): {bad[:5]}", param=param, code="invalid_token_id")


# ------------------------------------------------------------------ chat


async def chat_prompt(ctx: Context, req: ChatPrompt) -> tuple[list[int], EncodedChat, str]:
    """A chat's prompt ids, its rendering, and the output the prompt forces (a forced tool call's
    opening, which the parser reads as if generated; "" when none)."""
    try:
        encoded = await asyncio.get_running_loop().run_in_executor(None, lambda: encode_chat(
            ctx.tokenizer, req.messages, tools=req.tools, tool_choice=req.tool_choice,
            response_format=req.response_format, thinking=req.thinking_on, reasoning_effort=req.effort,
            replies=ctx.replies.lookup))
    except ChatEncodingError as exc:
        raise invalid(str(exc), param=exc.param, code=exc.code) from None
    prompt = encoded.token_ids
    forced = _forced_tool(req)
    if forced is None or not encoded.rendered.tools_enabled:
        return prompt, encoded, ""
    # tool_choice forces a call: the prompt goes on with the call's opening (after an empty
    # reasoning when thinking)
    out = SegmentBuilder()
    if encoded.rendered.starts_in_reasoning:
        out.special(st.THINK_END)
    forced_call_opening(out, forced or None)
    segments = out.build()
    return prompt + encode_segments(ctx.tokenizer, segments), encoded, spell(segments)


async def converted_chat_prompt(ctx: Context, to_form: Callable[[], ChatForm],
                                to_chat: Callable[[ChatForm], ChatPrompt],
                                name: Callable[[str | None, ChatForm], str | None]):
    """chat_prompt of a request another API's shape converts into chat messages (to_form) and
    options (to_chat): what the chat side refuses is a 400 named as that request names the
    field (name: a chat field's name, and the form whose sources say where each message came
    from)."""
    form = ChatForm()
    try:
        form = to_form()
        return await chat_prompt(ctx, to_chat(form))
    except ValidationError as exc:  # (a shape the chat request's own fields refuse)
        raise invalid_from(exc) from None
    except ChatEncodingError as exc:
        raise invalid(exc.message, param=name(exc.param, form), code=exc.code) from None
    except APIError as exc:
        exc.param = name(exc.param, form)
        raise


def refuse_unsupported(refused: tuple[str, str] | None) -> None:
    """A request model's `unsupported()`: (field, why) as a 400 naming the field."""
    if refused is not None:
        raise invalid(refused[1], param=refused[0])


async def chat_completions(ctx: Context, request: Request):
    req = await read_body(request, ChatCompletionRequest, ctx.settings.max_body_bytes)
    prompt, encoded, forced_text = await chat_prompt(ctx, req)
    max_tokens = budget(ctx, len(prompt), req.limit, "max_tokens")
    _check_scored([prompt], req.prompt_logprobs, "prompt_logprobs")
    top = req.top_logprobs or 0
    spec = GenerationSpec(
        request_id=request_id_of(request, "chatcmpl"), prompt=prompt,
        sampling=sampling_proto(ctx, req, max_tokens, req.logprobs, top, req.prompt_logprobs), n=req.n,
        route=await route(ctx, conversation_of(request, req), prompt), stops=req.stop_list(), chat=True,
        starts_in_reasoning=encoded.rendered.starts_in_reasoning, tools_enabled=encoded.rendered.tools_enabled,
        forced_text=forced_text, timeout_s=ctx.settings.request_timeout_s,
        max_tool_calls=1 if req.parallel_tool_calls is False else None)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return await respond(ctx, request, [spec], req.stream, _ChatFormat(ctx, spec, req, include_usage))


def _forced_tool(req: ChatPrompt) -> str | None:
    """"" for tool_choice "required", the function name for a named choice, None otherwise."""
    choice = req.tool_choice
    if choice == "required":
        return ""
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return str(choice["function"].get("name") or "")
    return None


class _ChatFormat:
    object, chunk_object = "chat.completion", "chat.completion.chunk"

    def __init__(self, ctx: Context, spec: GenerationSpec, req: ChatCompletionRequest, include_usage: bool,
                 prompt_tokens: int | None = None):
        """spec: the request's (or its first prompt's); prompt_tokens: all its prompts' (spec's alone)."""
        self.ctx, self.spec, self.req, self.include_usage = ctx, spec, req, include_usage
        self.prompt_tokens = len(spec.prompt) if prompt_tokens is None else prompt_tokens
        self.created = int(time.time())
        self.continuous_usage = include_usage and req.stream_options.continuous_usage_stats
        self._framed: dict[int, int] = {}  # each choice's tokens in the chunks framed so far

    def usage(self, choices) -> dict:
        return R.usage(self.prompt_tokens, choices, self.spec.n)

    def head(self) -> dict:
        return {"id": self.spec.request_id, "created": self.created, "model": self.ctx.settings.model_name}

    def opening(self) -> list[dict]:
        return [{**self.head(), "object": self.chunk_object, "choices": [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(self.spec.n)], **self._usage_null()}]

    def _usage_null(self, update=None) -> dict:
        """A chunk's usage: none, null, or (continuous_usage_stats) the tokens framed so far."""
        if not self.continuous_usage:
            return {"usage": None} if self.include_usage else {}
        if update is not None:
            self._framed[update.choice.index] = update.reply_tokens
        done = sum(self._framed.values())
        return {"usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                          "total_tokens": self.prompt_tokens + done}}

    def chunk(self, update) -> dict | None:
        delta = R.name_reasoning(update.delta or {}, self.ctx.settings.reasoning_field)
        logprobs = R.chat_logprobs(self.ctx.tokenizer, update.logprobs) if self.req.logprobs and update.logprobs else None
        if not delta and not logprobs and not update.done:
            return None
        choice = {"index": update.choice.index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": update.choice.finish_reason if update.done else None}
        if update.done and self.req.return_token_ids:
            choice["token_ids"] = update.choice.token_ids
        return {**self.head(), "object": self.chunk_object, "choices": [choice], **self._usage_null(update)}

    def body(self, choices) -> dict:
        return {**self.head(), "object": self.object, "system_fingerprint": None,
                "choices": [R.chat_message(c, self.ctx.tokenizer, self.req.logprobs, self.req.return_token_ids,
                                           self.ctx.settings.reasoning_field) for c in choices],
                "usage": self.usage(choices), **self._prompt_logprobs(choices[0] if choices else None)}

    # the framing `respond` asks a format for: OpenAI's chunks as `data:` lines, then [DONE]

    def stream_start(self) -> list[str]:
        return [R.sse(chunk) for chunk in self.opening()]

    def stream_update(self, update) -> list[str]:
        chunk = self.chunk(update)
        return [R.sse(chunk)] if chunk is not None else []

    def stream_failed(self, error: APIError) -> list[str]:
        return [R.sse(error.body()), R.SSE_DONE]

    async def stream_end(self, choices) -> list[str]:
        usage = [R.sse({**self.head(), "object": self.chunk_object, "choices": [],
                        "usage": self.usage(choices)})]
        return (usage if self.include_usage else []) + [R.SSE_DONE]

    async def reply(self, choices) -> dict:
        return self.body(choices)

    def _prompt_logprobs(self, choice) -> dict:
        """vLLM's prompt_logprobs, where asked for: the reply's (a chat has one prompt), or a
        completion choice's (its prompt's)."""
        if self.req.prompt_logprobs is None or choice is None:
            return {}
        return {"prompt_logprobs": R.prompt_logprobs(self.ctx.tokenizer, choice.prompt_logprobs,
                                                     self.req.prompt_logprobs)}


# ------------------------------------------------------------------ text completions


async def completions(ctx: Context, request: Request):
    req = await read_body(request, CompletionRequest, ctx.settings.max_body_bytes)
    prompts = await _prompts(ctx, req.prompt, req.n)
    want = req.logprobs is not None
    # echo's logprobs score the prompt too, as vLLM's prompt_logprobs do: one scoring (a choice's) serves both
    scored = max((k for k in (req.prompt_logprobs, req.logprobs if req.echo else None) if k is not None), default=None)
    _check_scored(prompts, scored, "prompt_logprobs" if req.prompt_logprobs is not None else "logprobs")
    samplings = [sampling_proto(ctx, req, budget(ctx, len(p), req.limit, "max_tokens"), want, req.logprobs or 0, scored)
                 for p in prompts]  # all checked before any is routed
    # A conversation continues one prompt; a batch's prompts are routed by their prefixes alone.
    conversation = conversation_of(request, req) if len(prompts) == 1 else None
    request_id = request_id_of(request, "cmpl")
    specs, continued = [], set()
    for i, (p, sampling) in enumerate(zip(prompts, samplings)):
        to = await route(ctx, conversation, p)
        if to.conversation_id in continued:  # two prompts matched one conversation: the first continues it
            to = replace(to, conversation_id="")
        continued.add(to.conversation_id)
        specs.append(GenerationSpec(request_id=request_id, prompt=p, sampling=sampling, n=req.n, route=to,
                                    stops=req.stop_list(), chat=False, timeout_s=ctx.settings.request_timeout_s,
                                    first_index=i * req.n, hide_output=req.prompt_only))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    echoes = None
    if req.echo:  # a text prompt as sent, token ids as their text
        echoes = [R.Echo(t if isinstance(t, str) else ctx.tokenizer.decode(p), p)
                  for t, p in zip(_batch(req.prompt), prompts)]
    fmt = _CompletionFormat(ctx, specs[0], req, include_usage, sum(len(p) for p in prompts), echoes)
    return await respond(ctx, request, specs, req.stream, fmt)


async def _prompts(ctx: Context, prompt, n: int) -> list[list[int]]:
    """A completion request's prompts as token ids: one text, texts, one list of ids or lists;
    at most MAX_CHOICES choices of n a prompt (checked before any is tokenized)."""
    batch = _batch(prompt)
    if len(batch) * n > MAX_CHOICES:
        raise invalid(f"at most {MAX_CHOICES} choices a request (prompts times n): send several requests",
                      param="prompt")
    if isinstance(batch[0], str):
        prompts = await asyncio.get_running_loop().run_in_executor(
            None, lambda: [ctx.tokenizer.encode_text(t) for t in batch])
    else:
        prompts = [list(p) for p in batch]
        for ids in prompts:
            _check_vocab(ctx, ids, "prompt")
    if not all(prompts):
        raise invalid("a prompt must have at least one token", param="prompt")
    return prompts


def _batch(prompt) -> list:
    """A completion request's prompt as a list of prompts (texts, or lists of token ids)."""
    return [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt


class _CompletionFormat(_ChatFormat):
    object = chunk_object = "text_completion"

    def __init__(self, ctx: Context, spec: GenerationSpec, req: CompletionRequest, include_usage: bool,
                 prompt_tokens: int, echoes: list[R.Echo] | None):
        super().__init__(ctx, spec, req, include_usage, prompt_tokens)
        self.echoes = echoes  # echo: each prompt's, put before its choices' text
        self._offsets: dict[int, R.TextOffsets] = {}  # a streamed choice's: its text_offset goes on from chunk to chunk

    def opening(self) -> list[dict]:
        return []

    def _echo(self, choice) -> R.Echo | None:
        return self.echoes[choice.index // self.spec.n] if self.echoes is not None else None

    def chunk(self, update) -> dict | None:
        index, tokenizer = update.choice.index, self.ctx.tokenizer
        echo = self._echo(update.choice) if index not in self._offsets else None  # a choice's first chunk
        if not update.text and not update.done and not update.logprobs and echo is None:
            return None
        offsets = self._offsets.setdefault(index, R.TextOffsets(tokenizer))
        text = (echo.text if echo is not None else "") + update.text
        logprobs = None
        if self.req.logprobs is not None:
            logprobs = R.completion_logprobs(tokenizer, update.logprobs, offsets, self.req.logprobs, echo,
                                             update.choice.prompt_logprobs)
        choice = {"index": index, "text": text, "logprobs": logprobs,
                  "finish_reason": update.choice.finish_reason if update.done else None}
        if update.done and self.req.return_token_ids:
            choice["token_ids"] = update.choice.token_ids
        return {**self.head(), "object": self.object, "choices": [choice], **self._usage_null(update)}

    def body(self, choices) -> dict:
        return {**self.head(), "object": self.object, "system_fingerprint": None,
                "choices": [{**R.completion_choice(c, self.ctx.tokenizer, self.req.logprobs, self.req.return_token_ids,
                                                   self._echo(c)), **self._prompt_logprobs(c)}
                            for c in choices],
                "usage": self.usage(choices)}


# ------------------------------------------------------------------ relaying


async def respond(ctx: Context, request: Request, specs: list[GenerationSpec], stream: bool, fmt):
    """The reply to the request whose prompts' generations are `specs`, streamed or whole, in
    `fmt`'s form (_ChatFormat's framing methods: stream_start, stream_update, stream_failed,
    stream_end, reply)."""
    metrics = ctx.metrics.start(fmt.prompt_tokens, fmt.spec.n)
    headers = {"X-Request-Id": fmt.spec.request_id}  # (app._EchoRequestId puts a client's own id back)
    if stream:
        # The headers wait for the first update, up to a keep-alive period: a request the
        # workers refuse at once (overloaded, no worker) gets its real status, which clients
        # retry on, not a 200 and an error event. A long prefill starts the stream at the
        # period's end, and its keep-alives hold proxies from there.
        pump = _Pump(ctx, specs)
        try:
            first = await _first_items(request, pump, ctx.settings.keepalive_s)
        except BaseException:
            pump.close()
            raise
        if first and isinstance(first[-1], APIError):
            pump.close()
            metrics.failed()
            raise first[-1]
        return _ClosingStream(_stream(ctx, pump, first, fmt, metrics), on_close=pump.close,
                              media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})
    task = asyncio.ensure_future(_collect(ctx, specs, metrics))
    watcher = asyncio.ensure_future(_cancel_on_disconnect(request, task))
    try:
        choices = await task
    except asyncio.CancelledError:
        raise APIError(499, "client closed the request", code="client_closed") from None
    finally:
        watcher.cancel()
    return JSONResponse(await fmt.reply(choices), headers=headers)


class _ClosingStream(StreamingResponse):
    """A StreamingResponse that closes its generator however the response ends. Starlette
    leaves a generator a disconnect interrupted suspended at its yield, to be closed when it is
    garbage collected: its `finally` (which cancels the worker's stream) ran seconds later or
    not at all, so a worker kept decoding for a client that had gone. on_close: also called
    (the relay it streams began before it: a body never started has no finally of its own)."""

    def __init__(self, content, *, on_close, **options):
        super().__init__(content, **options)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self.on_close()


async def _collect(ctx: Context, specs: list[GenerationSpec], metrics):
    choices = {}
    try:
        async for update in relay(specs, ctx.clients, ctx.tokenizer, ctx.replies):
            metrics.tokens(update)
            choices[update.choice.index] = update.choice
    except Exception:
        metrics.failed()
        raise
    ordered = [choices[i] for i in sorted(choices)]
    metrics.finished(ordered)
    return ordered


async def _cancel_on_disconnect(request: Request, task: asyncio.Future) -> None:
    while not task.done():
        if await request.is_disconnected():
            task.cancel()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


async def _first_items(request: Request, pump: _Pump, wait_s: float) -> list:
    """The relay's items up to its first token (a forced call's opening comes before any), an
    error or its end, as many as come within wait_s; a client that leaves meanwhile is a 499
    (the caller closes the relay)."""
    items, deadline = [], time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            item = await pump.next(min(left, DISCONNECT_POLL_S))
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                raise APIError(499, "client closed the request", code="client_closed") from None
            continue
        items.append(item)
        if item is _ENDED or isinstance(item, APIError) or item.tokens or item.done:
            break
    return items


DISCONNECT_POLL_S = 0.25


class _Pump:
    """A request's relay running into a queue: its updates, then _ENDED, or an APIError."""

    def __init__(self, ctx: Context, specs: list[GenerationSpec]):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run(ctx, specs))

    async def _run(self, ctx: Context, specs: list[GenerationSpec]) -> None:
        try:
            async for update in relay(specs, ctx.clients, ctx.tokenizer, ctx.replies):
                await self.queue.put(update)
            await self.queue.put(_ENDED)
        except APIError as exc:
            await self.queue.put(exc)
        except Exception:  # the stream must end, not wait on keep-alives: ours, a 500
            log.exception("relaying a stream failed")
            await self.queue.put(APIError(500, "internal error", type="server_error"))

    async def next(self, timeout_s: float):
        return await asyncio.wait_for(self.queue.get(), timeout_s)

    def close(self) -> None:
        self.task.cancel()


_ENDED = object()  # the relay's last item


async def _stream(ctx: Context, pump: _Pump, first: list, fmt, metrics):
    """first: the relay's items taken before the headers went. (The response closes the relay:
    _ClosingStream's on_close.)"""
    for text in fmt.stream_start():
        yield text
    choices = {}
    while True:
        if first:
            item = first.pop(0)
        else:
            try:
                item = await pump.next(ctx.settings.keepalive_s)
            except asyncio.TimeoutError:
                yield R.SSE_KEEPALIVE  # a long prefill: keep proxies from closing the stream
                continue
        if item is _ENDED:
            break
        if isinstance(item, APIError):
            metrics.failed()
            for text in fmt.stream_failed(item):
                yield text
            return
        metrics.tokens(item)
        choices[item.choice.index] = item.choice
        for text in fmt.stream_update(item):
            yield text
    ordered = [choices[i] for i in sorted(choices)]
    metrics.finished(ordered)
    for text in await fmt.stream_end(ordered):
        yield text
