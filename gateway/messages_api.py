"""Anthropic's Messages API over the chat path: POST /v1/messages and
/v1/messages/count_tokens (clients such as Claude Code and Anthropic's SDKs, pointed here).

A request's system prompt and messages become chat messages, rendered, routed and relayed
exactly as a chat completion's; the reply's deltas become content blocks (delta_blocks.py)
and, streamed, Anthropic's events: message_start, content_block_start / _delta / _stop a
block, message_delta (the stop reason and usage), message_stop. Errors take Anthropic's shape
on these paths (errors.anthropic_body).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request

from . import responses as R
from .delta_blocks import DeltaBlocks, Step
from .endpoints import (Context, budget, converted_chat_prompt, read_body, refuse_unsupported, request_id_of, respond,
                        route, sampling_proto)
from .errors import APIError
from .generation import GenerationSpec
from .messages_items import (chat_messages, chat_tool_choice, chat_tools, text_block, thinking_block, thinking_effort,
                             tool_use_block)
from .responses_items import ChatForm, chat_response_format, new_id, seal_reasoning
from .schema import ChatPrompt, CountTokensRequest, MessagesRequest


async def create(ctx: Context, request: Request):
    req = await read_body(request, MessagesRequest, ctx.settings.max_body_bytes)
    refuse_unsupported(req.unsupported())
    prompt, encoded, forced_text = await _prompt(ctx, req)
    max_tokens = budget(ctx, len(prompt), req.max_tokens, "max_tokens")
    parallel = not (req.tool_choice or {}).get("disable_parallel_tool_use", False)
    spec = GenerationSpec(
        request_id=request_id_of(request, "msg"), prompt=prompt,
        sampling=sampling_proto(ctx, req, max_tokens, False, 0), n=1,
        route=await route(ctx, request.headers.get("x-conversation-id") or req.conversation_id, prompt),
        stops=req.stop_list(), chat=True, starts_in_reasoning=encoded.rendered.starts_in_reasoning,
        tools_enabled=encoded.rendered.tools_enabled, forced_text=forced_text,
        timeout_s=ctx.settings.request_timeout_s, max_tool_calls=None if parallel else 1)
    omit = (req.thinking or {}).get("display") == "omitted"
    return await respond(ctx, request, [spec], req.stream, MessagesFormat(ctx, spec, omit_thinking=omit))


async def count_tokens(ctx: Context, request: Request) -> dict:
    req = await read_body(request, CountTokensRequest, ctx.settings.max_body_bytes)
    return {"input_tokens": len((await _prompt(ctx, req))[0])}


async def _prompt(ctx: Context, req: MessagesRequest | CountTokensRequest):
    def to_chat(form: ChatForm) -> ChatPrompt:
        output = req.output_config or {}
        thinking, effort = thinking_effort(req.thinking, output.get("effort"))
        return ChatPrompt(messages=form.messages, tools=chat_tools(req.tools),
                          tool_choice=chat_tool_choice(req.tool_choice),
                          response_format=chat_response_format(output.get("format")),
                          thinking={"type": "enabled" if thinking else "disabled"}, reasoning_effort=effort)

    return await converted_chat_prompt(ctx, lambda: chat_messages(req.system, req.messages), to_chat, _param)


def _param(param: str | None, form: ChatForm) -> str | None:
    """A chat message's name as this request names it: the block or message it came from."""
    return (form.source(param, "messages") or param) if param else param


STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
BLOCK_DELTAS = {"reasoning": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
                "call": ("input_json_delta", "partial_json")}


class MessagesFormat:
    """A reply's framing for `respond`: the message whole, or its events streamed (`event:` and
    `data:` lines, Anthropic's; no [DONE])."""

    def __init__(self, ctx: Context, spec: GenerationSpec, omit_thinking: bool = False):
        """omit_thinking: thinking.display "omitted": thinking blocks carry their signature (the
        sealed text, so the next turn has it) and no text."""
        self.ctx, self.spec, self.omit_thinking = ctx, spec, omit_thinking
        self.prompt_tokens = len(spec.prompt)
        self.id, self.created = new_id("msg"), int(time.time())
        self.blocks = DeltaBlocks()  # a stream's

    def message(self, content: list[dict], stop_reason: str | None, stop_sequence: str | None,
                usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.ctx.settings.model_name,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def stream_start(self) -> list[str]:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        return [R.typed_sse({"type": "message_start", "message": self.message([], None, None, usage)})]

    def stream_update(self, update) -> list[str]:
        return [R.typed_sse(e) for step in self.blocks.feed(update.delta) for e in self._events(step)]

    def stream_failed(self, error: APIError) -> list[str]:
        return [R.typed_sse(error.anthropic_body())]

    async def stream_end(self, choices) -> list[str]:
        events = [e for step in self.blocks.finish() for e in self._events(step)]
        reason, sequence = _stop(choices[0])
        events += [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": _usage(self.prompt_tokens, choices[0])},
                   {"type": "message_stop"}]
        return [R.typed_sse(e) for e in events]

    async def reply(self, choices) -> dict:
        """The whole reply, through the same blocks a stream makes."""
        choice, blocks = choices[0], DeltaBlocks()
        blocks.feed(choice.message.to_openai() if choice.message is not None else None)
        blocks.finish()
        content = [self._content(block) for block in blocks.closed]
        return self.message(content, *_stop(choice), _usage(self.prompt_tokens, choice))

    def _content(self, block) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {**thinking_block(block.text), **({"thinking": ""} if self.omit_thinking else {})}
        if block.kind == "text":
            return text_block(block.text)
        return tool_use_block(block.call_id, block.name, block.text)

    def _events(self, step: Step) -> list[dict[str, Any]]:
        block = step.block
        if step.action == "open":
            start = {"reasoning": {"type": "thinking", "thinking": "", "signature": ""}, "text": text_block(""),
                     "call": {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}}[block.kind]
            return [{"type": "content_block_start", "index": block.index, "content_block": start}]
        if step.action == "text":
            if block.kind == "reasoning" and self.omit_thinking:
                return []
            kind, field = BLOCK_DELTAS[block.kind]
            return [{"type": "content_block_delta", "index": block.index, "delta": {"type": kind, field: step.piece}}]
        events = []
        if block.kind == "reasoning":
            events.append({"type": "content_block_delta", "index": block.index,
                           "delta": {"type": "signature_delta", "signature": seal_reasoning(block.text)}})
        return events + [{"type": "content_block_stop", "index": block.index}]


def _stop(choice) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished choice."""
    matched = choice.detok.matched_stop if choice.detok is not None else None
    if choice.finish_reason == "stop" and matched is not None:
        return "stop_sequence", matched
    return STOP_REASONS.get(choice.finish_reason, "end_turn"), None


def _usage(prompt_tokens: int, choice) -> dict:
    """Anthropic counts the prompt's cached tokens apart from its input_tokens."""
    chat = R.usage(prompt_tokens, [choice])
    cached = chat["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": prompt_tokens - cached, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0, "output_tokens": chat["completion_tokens"]}

