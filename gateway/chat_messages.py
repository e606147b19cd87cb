"""OpenAI `messages` -> validated V4.1 turns.

V4.1 has no tool role: tool results join the user turn that follows the assistant's calls as
`<tool_result>` blocks, and consecutive user messages share one turn (official
`merge_tool_messages`); results are then put in the order of the calls that asked for them
(`sort_tool_results_by_call_order`). `developer` is the system role under its newer OpenAI
name (vLLM's V4.1 wrapper maps it the same way). Only text content is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .chat_errors import ChatEncodingError
from .dsml import arguments_as_dict

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
PART_SEPARATOR = "\n\n"  # official: text parts of one message are joined by a blank line


@dataclass
class SystemTurn:
    text: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    response_format: dict[str, Any] | None = None


@dataclass
class ToolResult:
    call_id: str
    text: str


@dataclass
class UserTurn:
    blocks: list[str | ToolResult]  # str: the text of one user message


@dataclass
class ReminderTurn:
    text: str


@dataclass
class ToolCall:
    call_id: str
    name: str
    params: dict[str, Any]


@dataclass
class AssistantTurn:
    content: str
    reasoning: str
    calls: list[ToolCall]


Turn = SystemTurn | UserTurn | ReminderTurn | AssistantTurn


def parse_messages(messages: Any) -> list[Turn]:
    """Validate OpenAI messages and merge them into V4.1 turns (tool results ordered by call)."""
    if not isinstance(messages, list) or not messages:
        raise ChatEncodingError("messages must be a non-empty list", "messages")
    turns: list[Turn] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatEncodingError(f"{where} must be an object", where)
        role = message.get("role")
        if role in ("system", "developer"):
            turns.append(SystemTurn(_text(message.get("content"), f"{where}.content")))
        elif role == "latest_reminder":
            turns.append(ReminderTurn(_text(message.get("content"), f"{where}.content")))
        elif role == "assistant":
            turns.append(_assistant(message, where))
        elif role in ("user", "tool"):
            block = _user_block(message, where)
            if turns and isinstance(turns[-1], UserTurn):
                turns[-1].blocks.append(block)
            else:
                turns.append(UserTurn([block]))
        else:
            raise ChatEncodingError(f"{where}.role must be one of system, developer, user, assistant, tool, "
                                    f"latest_reminder; got {role!r}", f"{where}.role")
    _order_tool_results(turns)
    return turns


def _user_block(message: dict[str, Any], where: str) -> str | ToolResult:
    text = _text(message.get("content"), f"{where}.content")
    if message["role"] == "user":
        return text
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise ChatEncodingError(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
    return ToolResult(call_id, text)


def _assistant(message: dict[str, Any], where: str) -> AssistantTurn:
    content = _text(message.get("content"), f"{where}.content", allow_none=True)
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise ChatEncodingError(f"{where}.reasoning_content must be a string", f"{where}.reasoning_content")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ChatEncodingError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    calls = [_tool_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(raw_calls)]
    return AssistantTurn(content, reasoning or "", calls)


def _tool_call(call: Any, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise ChatEncodingError(f"{where} must be a function call with a 'function' object", where)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ChatEncodingError(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
    call_id = call.get("id") or ""
    if not isinstance(call_id, str):
        raise ChatEncodingError(f"{where}.id must be a string", f"{where}.id")
    return ToolCall(call_id, name, arguments_as_dict(function.get("arguments", "{}")))


def _text(content: Any, where: str, *, allow_none: bool = False) -> str:
    """A message's content as text: a string, or text parts joined by a blank line."""
    if isinstance(content, str):
        return content
    if content is None and allow_none:
        return ""
    if not isinstance(content, list):
        raise ChatEncodingError(f"{where} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) and isinstance(part.get("type"), str) else None
        if kind not in TEXT_PART_TYPES:
            raise ChatEncodingError(f"{where}[{j}]: content part type {kind!r} is not supported; "
                                    "this model accepts text only", f"{where}[{j}].type", "unsupported_content_type")
        if not isinstance(part.get("text"), str):
            raise ChatEncodingError(f"{where}[{j}].text must be a string", f"{where}[{j}].text")
        texts.append(part["text"])
    return PART_SEPARATOR.join(texts)


def _order_tool_results(turns: list[Turn]) -> None:
    """Put each user turn's tool results in the order of the latest assistant's calls.

    Text blocks keep their places; results whose id matches no call sort as the first call,
    and ties keep their arrival order (the official sort is stable with default 0).
    """
    order: dict[str, int] = {}
    for turn in turns:
        if isinstance(turn, AssistantTurn) and turn.calls:
            order = {c.call_id: k for k, c in enumerate(turn.calls) if c.call_id}
        elif isinstance(turn, UserTurn) and order:
            results = [b for b in turn.blocks if isinstance(b, ToolResult)]
            if len(results) < 2:
                continue
            ranked = iter(sorted(results, key=lambda r: order.get(r.call_id, 0)))
            turn.blocks = [next(ranked) if isinstance(b, ToolResult) else b for b in turn.blocks]
