"""Request-level chat options: reasoning effort, tools, tool_choice, response_format.

Each is validated here and reduced to what the renderer needs; mistakes raise
ChatEncodingError naming the field.
"""

from __future__ import annotations

from typing import Any

from .chat_errors import ChatEncodingError

# Official aliases low/high/max = 50/75/100, default "high" [ENC]. "medium" is not in the official
# table; OpenAI clients send it, so it maps to the midpoint of low and high (our choice).
EFFORT_LEVELS: dict[str, int] = {"low": 50, "medium": 62, "high": 75, "max": 100}
DEFAULT_EFFORT = EFFORT_LEVELS["high"]
EFFORT_OFF = "none"  # OpenAI's "no reasoning": the same as thinking off


def resolve_effort(thinking: bool, reasoning_effort: str | int | None) -> int | None:
    """The numeric effort to render, or None for chat mode (thinking off).

    The effort is validated even when thinking is off, as the official encoder does.
    """
    effort = reasoning_effort
    if effort is None:
        value = DEFAULT_EFFORT
    elif effort == EFFORT_OFF:
        return None
    elif isinstance(effort, str) and effort in EFFORT_LEVELS:
        value = EFFORT_LEVELS[effort]
    elif type(effort) is int and 1 <= effort <= 100:  # bool is an int subclass; refuse it
        value = effort
    else:
        names = ", ".join([*EFFORT_LEVELS, EFFORT_OFF])
        raise ChatEncodingError(f"reasoning_effort must be one of {names} or an integer from 1 to 100, "
                                f"got {effort!r}", "reasoning_effort")
    return value if thinking else None


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI `tools` -> the function objects whose JSON goes into the prompt, as given."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ChatEncodingError("tools must be a list", "tools")
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ChatEncodingError(f"{where} must be an object with type 'function'", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ChatEncodingError(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ChatEncodingError(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
        functions.append(function)
    return functions


def tools_for_prompt(functions: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]]:
    """The functions to list in the prompt under `tool_choice`.

    "none" lists none, so the model is not invited to call any (the format has no other way
    to forbid calls). "required" and a named function cannot be forced without constrained
    decoding; they are validated and all tools listed.
    """
    if tool_choice is None or tool_choice == "auto":
        return functions
    if tool_choice == "none":
        return []
    if tool_choice == "required":
        if not functions:
            raise ChatEncodingError("tool_choice 'required' needs tools", "tool_choice")
        return functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in {f["name"] for f in functions}:
            raise ChatEncodingError(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
        return functions
    raise ChatEncodingError("tool_choice must be 'none', 'auto', 'required' or "
                            "{'type': 'function', 'function': {'name': ...}}", "tool_choice")


def parse_response_format(response_format: Any) -> dict[str, Any] | None:
    """The response_format to write into the system prompt, or None ("text" or absent).

    The official encoder writes the request's response_format object itself as the schema
    (`to_json(response_format)`), so json_object renders `{"type": "json_object"}` and
    json_schema the whole object including its `json_schema` member.
    """
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return response_format
    if kind == "json_schema":
        if not isinstance(response_format.get("json_schema"), dict):
            raise ChatEncodingError("response_format.json_schema must be an object", "response_format.json_schema")
        return response_format
    raise ChatEncodingError("response_format.type must be 'text', 'json_object' or 'json_schema'",
                            "response_format.type")
