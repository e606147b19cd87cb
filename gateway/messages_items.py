"""Anthropic's Messages API, to and from the chat form the renderer and parser speak.

Request: `system` is a system message; a user message's text blocks are its text and its
`tool_result` blocks tool results; an assistant message's `thinking` blocks are its
reasoning, its text blocks its content, its `tool_use` blocks its calls. Tools carry an
`input_schema` (chat's `parameters`); `tool_choice` any / tool / none is chat's required /
named / none. Thinking is off unless `thinking` asks for it (Anthropic's contract), and its
`budget_tokens` picks DeepSeek's effort.

Reply: a thinking block (its signature seals the text, so a client sending it back sends
the text), a text block, a tool_use block a call.
"""

from __future__ import annotations

import json
from typing import Any

from .chat_errors import ChatEncodingError
from .chat_messages import PART_SEPARATOR
from .responses_items import ChatForm, chat_effort, joined, seal_reasoning, unseal_reasoning

# budget_tokens -> DeepSeek's effort: below 4K tokens "low", below 16K "high", else "max"
# (Claude Code's think / think hard / ultrathink ask about 4K, 10K and 32K)
EFFORT_BUDGETS = ((4096, "low"), (16384, "high"))
THINKING_ON = ("enabled", "adaptive", "between_tools")
CHAT_TOOL_KEYS = {"name": "name", "description": "description", "input_schema": "parameters"}
UNSERVED_BLOCKS = frozenset({"image", "document", "search_result", "container_upload"})


def chat_messages(system: Any, messages: list[Any]) -> ChatForm:
    form = ChatForm()
    if system:
        form.add({"role": "system", "content": _texts(system, "system")}, "system")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ChatEncodingError(f"{where}.role must be 'user' or 'assistant'", f"{where}.role")
        blocks = _blocks(message.get("content"), f"{where}.content")
        if message["role"] == "user":
            _user(form, blocks, where)
        else:
            _assistant(form, blocks, where)
    if not form.messages or all(m["role"] == "system" for m in form.messages):
        raise ChatEncodingError("messages hold no content: at least one message needs a block", "messages")
    return form


def _blocks(content: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(content, str):
        return [(f"{where}", {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise ChatEncodingError(f"{where} must be a string or a list of content blocks", where)
    out = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise ChatEncodingError(f"{where}[{j}] must be a content block with a type", f"{where}[{j}].type")
        if kind in UNSERVED_BLOCKS:
            raise ChatEncodingError(f"{where}[{j}]: {kind} blocks are not supported; this model accepts text only",
                                    f"{where}[{j}].type", "unsupported_content_type")
        out.append((f"{where}[{j}]", block))
    return out


def _user(form: ChatForm, blocks: list[tuple[str, dict[str, Any]]], where: str) -> None:
    """Tool results first (as chat's tool messages), then the text: Anthropic's API puts
    results before any text in a user turn, and chat joins both into one user turn."""
    texts = []
    for at, block in blocks:
        if block["type"] == "text":
            texts.append(_text(block, at))
        elif block["type"] == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise ChatEncodingError(f"{at}.tool_use_id must be a non-empty string", f"{at}.tool_use_id")
            result = _texts(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):
                result = f"Error: {result}"  # (the format has no error flag: the model reads it)
            form.add({"role": "tool", "tool_call_id": call_id, "content": result}, at)
        else:
            raise ChatEncodingError(f"{at}: a user message takes text and tool_result blocks, not {block['type']}",
                                    f"{at}.type", "unsupported_content_type")
    if texts:
        form.add({"role": "user", "content": PART_SEPARATOR.join(texts)}, where)


def _assistant(form: ChatForm, blocks: list[tuple[str, dict[str, Any]]], where: str) -> None:
    reasoning, texts, calls = [], [], []
    for at, block in blocks:
        if block["type"] == "text":
            texts.append(_text(block, at))
        elif block["type"] == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise ChatEncodingError(f"{at}.thinking must be a string", f"{at}.thinking")
            # (shown "omitted", the text is empty and its signature holds it)
            reasoning.append(block["thinking"] or unseal_reasoning(block.get("signature")) or "")
        elif block["type"] == "redacted_thinking":
            continue  # another server's: unreadable here
        elif block["type"] == "tool_use":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
                raise ChatEncodingError(f"{at} needs a non-empty id and name", f"{at}")
            if not isinstance(block.get("input", {}), dict):
                raise ChatEncodingError(f"{at}.input must be an object", f"{at}.input")
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        else:
            raise ChatEncodingError(f"{at}: an assistant message takes text, thinking and tool_use blocks, not "
                                    f"{block['type']}", f"{at}.type", "unsupported_content_type")
    turn = form.assistant(where)  # (assistant messages in a row are one turn, as Anthropic's API takes them)
    turn["content"] = joined(turn["content"], PART_SEPARATOR.join(texts))
    turn["reasoning_content"] = joined(turn["reasoning_content"], PART_SEPARATOR.join(reasoning))
    turn["tool_calls"] += calls


def _text(block: dict[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise ChatEncodingError(f"{where}.text must be a string", f"{where}.text")
    return block["text"]


def _texts(content: Any, where: str) -> str:
    """A system prompt's or a tool result's content: a string, or text blocks."""
    if isinstance(content, str):
        return content
    blocks = _blocks(content, where)
    for at, block in blocks:
        if block["type"] != "text":
            raise ChatEncodingError(f"{at}: only text blocks are served here, not {block['type']}", f"{at}.type",
                                    "unsupported_content_type")
    return PART_SEPARATOR.join(_text(block, at) for at, block in blocks)


# ------------------------------------------------------------------ request options


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Client tools ({name, description, input_schema}) as chat tools; Anthropic's server tools
    (web search, code execution, computer use, ...) are not served."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if (tool.get("type") or "custom") != "custom":
            raise ChatEncodingError(f"tools[{i}].type {tool.get('type')!r} is not served: only client tools "
                                    "(name, description, input_schema) are", f"tools[{i}].type",
                                    "unsupported_tool_type")
        # in the tool's own key order: the prompt lists the function's JSON as written
        function = {CHAT_TOOL_KEYS[k]: v for k, v in tool.items() if k in CHAT_TOOL_KEYS}
        function.setdefault("parameters", {"type": "object"})
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ChatEncodingError("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", "tool_choice.type")


def thinking_effort(thinking: dict[str, Any] | None, effort: Any = None) -> tuple[bool, str | None]:
    """(thinking on, effort) from Anthropic's `thinking`: off unless enabled (or adaptive).
    effort: output_config.effort, which wins over the budget (xhigh is DeepSeek's high)."""
    if thinking is None or thinking.get("type") == "disabled":
        return False, None
    if thinking.get("type") not in THINKING_ON:
        raise ChatEncodingError(f"thinking.type must be one of {', '.join(THINKING_ON)} or disabled", "thinking.type")
    if effort is not None:
        return True, chat_effort(effort)
    budget = thinking.get("budget_tokens")
    if budget is None:
        return True, None
    if type(budget) is not int or budget < 1:
        raise ChatEncodingError("thinking.budget_tokens must be a positive integer", "thinking.budget_tokens")
    return True, next((effort for below, effort in EFFORT_BUDGETS if budget < below), "max")


# ------------------------------------------------------------------ reply


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": seal_reasoning(text)}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A call's arguments as its `input` object (a cut or malformed call: what parses, else {})."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        value = {}
    return {"type": "tool_use", "id": call_id, "name": name, "input": value if isinstance(value, dict) else {}}
