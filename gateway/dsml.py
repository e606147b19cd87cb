"""DSML, the V4.1 tool-call markup: its tags, and rendering calls and tool schemas into a prompt.

Format (official encoding/encoding.py as vendored by vLLM, `deepseek_v41_encoding.py` [ENC]):

    \\n\\n<｜DSML｜ calls>
    <｜DSML｜ invoke name="NAME">
    <｜DSML｜ parameter name="KEY" string="true|false">VALUE</｜DSML｜ parameter>
    </｜DSML｜ invoke>
    </｜DSML｜ calls>

`｜DSML｜` is one special token (128825); the rest is ordinary text. V4.1 puts a space before
the tag names (" calls", " invoke", " parameter"); V4 used `<｜DSML｜tool_calls>`. String values
are written raw, with no escaping; every other value is JSON (`json.dumps`, non-ASCII kept).
"""

from __future__ import annotations

import json
from typing import Any

from .segments import SegmentBuilder

_D = "｜DSML｜"
CALLS_OPEN = f"<{_D} calls>"
CALLS_CLOSE = f"</{_D} calls>"
INVOKE_OPEN = f'<{_D} invoke name="'
INVOKE_CLOSE = f"</{_D} invoke>"
PARAM_OPEN = f'<{_D} parameter name="'
PARAM_CLOSE = f"</{_D} parameter>"
BLOCK_LEAD = "\n\n"  # separates content (or reasoning's </think>) from the calls block

# The tools section of the system prompt, split around the schema list; official wording.
_TOOLS_HEAD = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "{CALLS_OPEN}" block like the following:

{CALLS_OPEN}
{INVOKE_OPEN}$TOOL_NAME">
{PARAM_OPEN}$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{PARAM_CLOSE}
...
{INVOKE_CLOSE}
{INVOKE_OPEN}$TOOL_NAME2">
...
{INVOKE_CLOSE}
{CALLS_CLOSE}

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

"""
_TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"


def to_json(value: Any) -> str:
    """JSON as the official encoder writes it: default separators, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)


def render_tools(out: SegmentBuilder, functions: list[dict[str, Any]]) -> None:
    """The tools section; the schemas are request data, so they stay plain text."""
    out.template(_TOOLS_HEAD)
    out.text("\n".join(to_json(f) for f in functions))
    out.template(_TOOLS_TAIL)


def arguments_as_dict(arguments: Any) -> dict[str, Any]:
    """OpenAI `function.arguments` (a JSON string, maybe encoded twice) -> a parameter dict.

    Anything that is not a JSON object after two decodes is kept whole under "arguments", as
    the official encoder does.
    """
    value = arguments
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            break
    return value if isinstance(value, dict) else {"arguments": arguments}


def render_calls(out: SegmentBuilder, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """`calls` as a DSML block, led by the blank line that separates it from the content."""
    out.template(BLOCK_LEAD + CALLS_OPEN + "\n")
    for i, (name, params) in enumerate(calls):
        if i:
            out.text("\n")
        out.template(INVOKE_OPEN).text(name).template('">\n')
        for j, (key, value) in enumerate(params.items()):
            is_string = isinstance(value, str)
            if j:
                out.text("\n")
            out.template(PARAM_OPEN).text(str(key))
            out.template(f'" string="{"true" if is_string else "false"}">')
            out.text(value if is_string else to_json(value)).template(PARAM_CLOSE)
        out.template("\n" + INVOKE_CLOSE)
    out.template("\n" + CALLS_CLOSE)


def forced_call_opening(out: SegmentBuilder, name: str | None) -> None:
    """The start of a tool call appended to the prompt when tool_choice forces one: the model
    continues inside the invoke (a named function) or at its name ("required")."""
    out.template(BLOCK_LEAD + CALLS_OPEN + "\n").template(INVOKE_OPEN)
    if name is not None:
        out.text(name).template('">\n')
