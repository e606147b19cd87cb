"""OpenAI's Responses API over the chat path: POST /v1/responses, GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items.

A request's input items (after those of the stored responses its previous_response_id
continues) become chat messages, rendered, routed and relayed exactly as a chat completion's;
the reply's deltas become output items and, streamed, the API's typed events. A stored
response (`store`, default true) keeps its input and output items, and the router's
conversation id, so the next turn reaches the decode worker that holds the cache.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from fastapi import Request

from . import responses as R
from .endpoints import (Context, budget, conversation_of, converted_chat_prompt, read_body, refuse_unsupported,
                        request_id_of, respond, route, sampling_proto)
from .errors import APIError, invalid
from .generation import GenerationSpec
from .response_store import StoredResponse, StoreUnavailable
from .responses_items import (ChatForm, chat_effort, chat_messages, chat_response_format, chat_tool_choice,
                              chat_tools, input_items, new_id)
from .responses_stream import OutputEvents
from .schema import ChatPrompt, ResponsesRequest

log = logging.getLogger("dsflash.gateway")

MAX_CHAIN = 10_000  # stored responses one previous_response_id may reach back through
HISTORY_READ_S = 10.0  # a chain read one record a turn: a slow store gets a 503, not a stalled request


async def create(ctx: Context, request: Request):
    req = await read_body(request, ResponsesRequest, ctx.settings.max_body_bytes)
    refuse_unsupported(req.unsupported())
    earlier, conversation = await _history(ctx, req.previous_response_id)
    items = input_items(req.input)
    _check_unique_ids(items)
    named = [(f"input[{i}]" if isinstance(req.input, list) else "input", item) for i, item in enumerate(items)]
    text_format = req.text.format.model_dump() if req.text and req.text.format else None

    def to_chat(form: ChatForm) -> ChatPrompt:
        return ChatPrompt(messages=form.messages, tools=chat_tools(req.tools),
                          tool_choice=chat_tool_choice(req.tool_choice),
                          response_format=chat_response_format(text_format), thinking=req.thinking,
                          reasoning_effort=chat_effort(req.reasoning.effort if req.reasoning else None),
                          parallel_tool_calls=req.parallel_tool_calls)

    prompt, encoded, forced_text = await converted_chat_prompt(
        ctx, lambda: chat_messages(earlier + named, req.instructions), to_chat,
        lambda param, form: _param(param, form, req.tools))
    max_tokens = budget(ctx, len(prompt), req.limit, "max_output_tokens")
    spec = GenerationSpec(
        request_id=request_id_of(request, "resp"), prompt=prompt,
        sampling=sampling_proto(ctx, req, max_tokens, req.wants_logprobs, req.top_logprobs or 0), n=1,
        route=await route(ctx, conversation_of(request, req, conversation), prompt), stops=req.stop_list(),
        chat=True, starts_in_reasoning=encoded.rendered.starts_in_reasoning,
        tools_enabled=encoded.rendered.tools_enabled, forced_text=forced_text, timeout_s=ctx.settings.request_timeout_s,
        max_tool_calls=1 if req.parallel_tool_calls is False else None)
    return await respond(ctx, request, [spec], req.stream, ResponsesFormat(ctx, spec, req, items))


async def retrieve(ctx: Context, response_id: str) -> dict:
    return (await _stored_or_404(ctx, response_id)).response


async def delete(ctx: Context, response_id: str) -> dict:
    if not await _store_call(ctx.responses.delete(response_id)):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def input_item_list(ctx: Context, response_id: str, query) -> dict:
    """A stored response's input items, a page at a time (OpenAI's limit, order and after)."""
    limit, order, after = query.get("limit", "20"), query.get("order", "desc"), query.get("after")
    if not re.fullmatch(r"[0-9]{1,3}", limit) or not 1 <= int(limit) <= 100:
        raise invalid("limit must be an integer in [1, 100]", param="limit")
    limit = int(limit)
    if order not in ("asc", "desc"):
        raise invalid("order must be 'asc' or 'desc'", param="order")
    items = (await _stored_or_404(ctx, response_id)).input
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise invalid(f"no input item {after!r} in response {response_id!r}", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


class ResponsesFormat:
    """A response's framing for `respond`: the response object whole, or its events streamed
    (`event:` and `data:` lines; no [DONE], the last event says how it ended)."""

    def __init__(self, ctx: Context, spec: GenerationSpec, req: ResponsesRequest, items: list[dict[str, Any]]):
        self.ctx, self.spec, self.req, self.items = ctx, spec, req, items
        self.prompt_tokens = len(spec.prompt)
        self.id, self.created = new_id("resp"), int(time.time())
        self.events = OutputEvents(req.seals_reasoning)  # a stream's

    def response(self, status: str, output: list[dict], usage: dict | None = None, error: dict | None = None) -> dict:
        req = self.req
        text_format = req.text.format.model_dump() if req.text and req.text.format else {"type": "text"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None,
                "background": False, "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "max_tool_calls": req.max_tool_calls,
                "model": self.ctx.settings.model_name, "output": output,
                "parallel_tool_calls": req.parallel_tool_calls is not False,
                "previous_response_id": req.previous_response_id,
                "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
                "store": req.store, "temperature": req.temperature, "text": {"format": text_format},
                "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
                "top_logprobs": req.top_logprobs or 0,
                "top_p": req.top_p, "truncation": "disabled", "usage": usage, "user": req.user,
                "prompt_cache_key": req.prompt_cache_key,
                "metadata": req.metadata or {}}

    def stream_start(self) -> list[str]:
        shell = self.response("in_progress", [])
        return [R.typed_sse(self.events.event("response.created", response=shell)),
                R.typed_sse(self.events.event("response.in_progress", response=shell))]

    def stream_update(self, update) -> list[str]:
        first = update.reply_tokens - len(update.tokens)  # the update's first token's place in the reply
        reasoning = update.choice.reasoning_tokens_in(update.reply_tokens)
        logprobs = self._text_logprobs(update.logprobs[max(0, reasoning - first):])
        return [R.typed_sse(e) for e in self.events.update(update.delta, logprobs)]

    def stream_failed(self, error: APIError) -> list[str]:
        """The open item closed as incomplete, then response.failed with OpenAI's error code (its
        list has no name for a worker's failure: server_error) and our message."""
        events = self.events.finish(complete=False) if self.events.opened else []
        code = "rate_limit_exceeded" if error.status == 429 else "server_error"
        failed = self.response("failed", self.events.items, error={"code": code, "message": error.message})
        return [R.typed_sse(e) for e in events + [self.events.event("response.failed", response=failed)]]

    async def stream_end(self, choices) -> list[str]:
        events = self.events.finish(_complete(choices[0]))
        final = await self._finished(choices[0], self.events.items)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [R.typed_sse(e) for e in events + [self.events.event(kind, response=final)]]

    async def reply(self, choices) -> dict:
        """The whole reply, through the same items a stream makes."""
        choice, events = choices[0], OutputEvents(self.req.seals_reasoning)
        message = choice.message.to_openai() if choice.message is not None else None
        events.update(message, self._text_logprobs(choice.logprobs[choice.reasoning_tokens:]))
        events.finish(_complete(choice))
        return await self._finished(choice, events.items)

    def _text_logprobs(self, items) -> list[dict]:
        """The logprobs of the reply's tokens after its reasoning, in output_text's form."""
        return R.chat_logprobs(self.ctx.tokenizer, items)["content"] if self.req.wants_logprobs and items else []

    async def _finished(self, choice, output: list[dict]) -> dict:
        final = self.response("completed" if _complete(choice) else "incomplete", output,
                              _usage(R.usage(self.prompt_tokens, [choice])))
        if self.req.store:
            record = StoredResponse(self.id, final, self.items, self.req.previous_response_id,
                                    self.spec.route.conversation_id)
            try:
                await self.ctx.responses.put(record)
            except StoreUnavailable as exc:  # the reply stands; a turn continuing it gets a clear 400
                log.warning("response_not_stored id=%s reason=%s", self.id, exc)
        return final


def _complete(choice) -> bool:
    return choice.finish_reason != "length"


def _usage(chat: dict) -> dict:
    return {"input_tokens": chat["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": chat["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": chat.get("completion_tokens_details", {})
                                      .get("reasoning_tokens", 0)},
            "total_tokens": chat["total_tokens"]}



def _check_unique_ids(items: list) -> None:
    """Input items are listed by id (`after` pages from one): two with one id get a 400."""
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        item_id = item.get("id") if isinstance(item, dict) else None
        if isinstance(item_id, str) and item_id in seen:
            raise invalid(f"input[{i}] has the id of input[{seen[item_id]}] ({item_id!r}): ids name one item each",
                          param=f"input[{i}].id")
        if not isinstance(item_id, (str, type(None))):
            raise invalid(f"input[{i}].id must be a string", param=f"input[{i}].id")
        seen.setdefault(item_id, i)


async def _history(ctx: Context, previous_id: str | None) -> tuple[list[tuple[str, Any]], str | None]:
    """The stored chain's items, oldest first, and its conversation id."""
    chain, response_id = [], previous_id
    began = time.monotonic()
    while response_id is not None:
        if time.monotonic() - began > HISTORY_READ_S:
            raise APIError(503, f"reading the {len(chain)} stored responses before {previous_id!r} took over "
                                f"{HISTORY_READ_S:.0f} s: the response store is too slow", type="service_unavailable",
                           code="response_store_unavailable")
        record = await _store_call(ctx.responses.get(response_id))
        if record is None:
            raise invalid(f"previous response {response_id!r} was not found: it expired or was deleted, was made "
                          "with store: false, or never existed", param="previous_response_id",
                          code="previous_response_not_found")
        chain.append(record)
        if len(chain) > MAX_CHAIN:
            raise invalid(f"previous_response_id reaches back through more than {MAX_CHAIN} responses",
                          param="previous_response_id")
        response_id = record.previous
    items = [("previous_response_id", item) for record in reversed(chain)
             for item in record.input + record.response["output"]]
    return items, chain[0].conversation if chain else None


async def _stored_or_404(ctx: Context, response_id: str) -> StoredResponse:
    record = await _store_call(ctx.responses.get(response_id))
    if record is None:
        raise _not_found(response_id)
    return record


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"no stored response {response_id!r}", code="not_found", param="response_id")


async def _store_call(op):
    try:
        return await op
    except StoreUnavailable as exc:
        raise APIError(503, str(exc), type="service_unavailable", code="response_store_unavailable") from None


_TOOL_PARAM = re.compile(r"tools\[(\d+)\]\.function")


def _param(param: str | None, form: ChatForm, tools: list | None) -> str | None:
    """A chat field's name as this request names it: a message by the input item it came from,
    a flat tool without chat's `function` level, response_format as text.format."""
    if param is None:
        return None
    source = form.source(param, "input")
    if source is not None:
        return source
    tool = _TOOL_PARAM.match(param)
    if tool and tools and int(tool.group(1)) < len(tools) and "function" not in tools[int(tool.group(1))]:
        return f"tools[{tool.group(1)}]" + param[tool.end():]
    if param.startswith("response_format"):
        return "text.format" + param[len("response_format"):].replace(".json_schema", "")
    return {"reasoning_effort": "reasoning.effort", "messages": "input"}.get(param, param)
