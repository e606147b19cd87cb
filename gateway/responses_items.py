"""The Responses API's items, to and from the chat form the renderer and parser speak.

Input: a text, or a list of items. Messages keep their roles (system, developer, user,
assistant); `reasoning`, assistant `message` and `function_call` items in a row are one
assistant turn (its reasoning, content and calls); a `function_call_output` is a tool result.
A response's own output items are valid input, so a stored conversation is replayed as the
items of each response in its chain, then the new input.

Output: a reasoning item (the reasoning text itself: this server makes no summaries), a
message with one output_text part, and a function_call item a call, in the order the model
wrote them.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

from .chat_errors import ChatEncodingError
from .chat_messages import PART_SEPARATOR, TEXT_PART_TYPES

# OpenAI's effort names that DeepSeek's table lacks, as DeepSeek's API maps them
EFFORT_ALIASES = {"minimal": "low", "xhigh": "high"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ChatForm:
    """Input items as chat messages; `sources[j]` names the input item message j came from."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    _assistant: dict[str, Any] | None = None  # the turn assistant-side items in a row join

    def add(self, message: dict[str, Any], source: str) -> None:
        self.messages.append(message)
        self.sources.append(source)
        self._assistant = None

    def source(self, param: str, otherwise: str) -> str | None:
        """For a chat field naming message j ("messages[3]..."), where message j came from
        (otherwise, where none is known); None for any other field."""
        if not param.startswith("messages["):
            return None
        j = int(param[len("messages["):param.index("]")])
        return self.sources[j] if j < len(self.sources) else otherwise

    def assistant(self, source: str) -> dict[str, Any]:
        if self._assistant is None:
            self.add({"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": []}, source)
            self._assistant = self.messages[-1]
        return self._assistant


def chat_messages(items: list[tuple[str, Any]], instructions: str | None) -> ChatForm:
    """items: (where, item) pairs (where: the item's name in an error, "input[3]"), the
    stored chain's first. instructions: a system message before them all."""
    form = ChatForm()
    if instructions:
        form.add({"role": "system", "content": instructions}, "instructions")
    for where, item in items:
        _add_item(form, item, where)
    return form


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as the items OpenAI stores and lists: a text is one user message; a
    message is typed, its text a part; each item has an id and a status. (What is not an item
    passes as it is, for the conversion to refuse.)"""
    return [_as_stored(item) for item in ([{"role": "user", "content": value}] if isinstance(value, str) else value)]


_ID_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc", "function_call_output": "fco"}


def _as_stored(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    kind = item.get("type", "message" if "role" in item else None)
    if not isinstance(kind, str):
        return item  # (the conversion refuses it)
    out = {**item, "type": kind}
    if kind == "message" and isinstance(out.get("content"), str):
        out["content"] = [{"type": "output_text", "text": out["content"], "annotations": []}
                          if out.get("role") == "assistant" else {"type": "input_text", "text": out["content"]}]
    if kind in ("message", "function_call", "function_call_output"):
        out.setdefault("status", "completed")
    if out.get("id") is None:
        out["id"] = new_id(_ID_PREFIXES.get(kind, "item"))
    return out


def _add_item(form: ChatForm, item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ChatEncodingError(f"{where} must be an object", where)
    kind = item.get("type", "message" if "role" in item else None)
    kind = kind if isinstance(kind, str) else repr(kind)
    if kind == "message":
        role = item.get("role")
        if role == "assistant":
            turn = form.assistant(where)
            turn["content"] = joined(turn["content"], _text(item.get("content"), f"{where}.content"))
        elif role in ("system", "developer", "user"):
            form.add({"role": role, "content": _text(item.get("content"), f"{where}.content")}, where)
        else:
            raise ChatEncodingError(f"{where}.role must be one of system, developer, user, assistant; got {role!r}",
                                    f"{where}.role")
    elif kind == "reasoning":
        turn = form.assistant(where)
        turn["reasoning_content"] = joined(turn["reasoning_content"], _reasoning_text(item, where))
    elif kind == "function_call":
        name, call_id = item.get("name"), item.get("call_id")
        if not isinstance(name, str) or not name:
            raise ChatEncodingError(f"{where}.name must be a non-empty string", f"{where}.name")
        if not isinstance(call_id, str) or not call_id:
            raise ChatEncodingError(f"{where}.call_id must be a non-empty string", f"{where}.call_id")
        arguments = item.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise ChatEncodingError(f"{where}.arguments must be a JSON string", f"{where}.arguments")
        form.assistant(where)["tool_calls"].append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    elif kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ChatEncodingError(f"{where}.call_id must be a non-empty string", f"{where}.call_id")
        form.add({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")},
                 where)
    elif kind == "item_reference":
        raise ChatEncodingError(f"{where}: item references are not resolved: send the item, or continue the "
                                "response with previous_response_id", f"{where}.type", "unsupported_item_type")
    else:
        raise ChatEncodingError(f"{where}.type {kind!r} is not served: message, reasoning, function_call and "
                                "function_call_output items are", f"{where}.type", "unsupported_item_type")


def joined(before: str, text: str) -> str:
    """Two items' texts in one turn, apart as chat keeps two text parts."""
    return PART_SEPARATOR.join(t for t in (before, text) if t)


def _text(content: Any, where: str) -> str:
    """A text, or text parts (input_text, output_text; a refusal's text) joined as chat joins them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatEncodingError(f"{where} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) and isinstance(part.get("type"), str) else None
        key = "refusal" if kind == "refusal" else "text"
        if kind not in TEXT_PART_TYPES and kind != "refusal":
            raise ChatEncodingError(f"{where}[{j}]: content part type {kind!r} is not supported; this model accepts "
                                    "text only", f"{where}[{j}].type", "unsupported_content_type")
        if not isinstance(part.get(key), str):
            raise ChatEncodingError(f"{where}[{j}].{key} must be a string", f"{where}[{j}].{key}")
        texts.append(part[key])
    return PART_SEPARATOR.join(texts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its reasoning_text parts, else its sealed text where this
    server sealed it (clients with store: false send only that back), else its summary's
    (another server's item may carry only a summary; another's encrypted content is dropped)."""
    unsealed = unseal_reasoning(item.get("encrypted_content"))
    if unsealed is not None and not item.get("content"):
        return unsealed
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise ChatEncodingError(f"{where}.{key} must be a list", f"{where}.{key}")
        texts = []
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != part_type or not isinstance(part.get("text"), str):
                raise ChatEncodingError(f"{where}.{key}[{j}] must be a {part_type} part with a text",
                                        f"{where}.{key}[{j}]")
            texts.append(part["text"])
        if texts:
            return PART_SEPARATOR.join(texts)
    return ""


# ------------------------------------------------------------------ request options


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Flat function tools ({type, name, description, parameters}) as chat tools; a chat-shaped
    tool passes as it is. Hosted tools (web search, file search, ...) are not served."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise ChatEncodingError(f"tools[{i}].type {tool.get('type')!r} is not served: only function tools are",
                                    f"tools[{i}].type", "unsupported_tool_type")
        if isinstance(tool.get("function"), dict):
            out.append(tool)
            continue
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """{"type": "function", "name": X} as chat's {"type": "function", "function": {"name": X}}."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") != "function":
        raise ChatEncodingError(f"tool_choice type {choice.get('type')!r} is not served: 'none', 'auto', "
                                "'required' or a function are", "tool_choice")
    return choice


def chat_response_format(text_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format as chat's response_format: json_schema's fields go under `json_schema`."""
    if text_format is None or text_format.get("type") == "text":
        return None
    if text_format.get("type") == "json_object":
        return {"type": "json_object"}
    if not isinstance(text_format.get("schema"), dict):
        raise ChatEncodingError("text.format.schema must be an object", "text.format.schema")
    fields = ("name", "description", "schema", "strict")
    return {"type": "json_schema", "json_schema": {k: text_format[k] for k in fields if k in text_format}}


def chat_effort(effort: str | int | None) -> str | int | None:
    return EFFORT_ALIASES.get(effort, effort) if isinstance(effort, str) else effort


# ------------------------------------------------------------------ output


def reasoning_item(item_id: str, text: str, sealed: bool = False) -> dict[str, Any]:
    """sealed: with `encrypted_content` (include: ["reasoning.encrypted_content"])."""
    item = {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    return {**item, "encrypted_content": seal_reasoning(text)} if sealed else item


# OpenAI's encrypted_content carries reasoning a client cannot read and sends back in its next
# turn (agents running with store: false). This server shows the reasoning anyway, so "sealing"
# only marks and encodes it; what matters is that the text comes back whole for the prompt.
SEAL_PREFIX = "dsflash-reasoning-v1:"


def seal_reasoning(text: str) -> str:
    return SEAL_PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


def unseal_reasoning(value: Any) -> str | None:
    """The text of a reasoning item this server sealed, else None."""
    if not isinstance(value, str) or not value.startswith(SEAL_PREFIX):
        return None
    try:
        return base64.b64decode(value[len(SEAL_PREFIX):], validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def text_part(text: str, logprobs: list[dict] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, text: str, logprobs: list[dict] | None, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [text_part(text, logprobs)]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
