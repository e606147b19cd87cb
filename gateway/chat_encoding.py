"""DeepSeek-V4.1 chat encoding: OpenAI messages -> prompt segments -> token ids.

Rules (spec/model-v41.md §6, from the official encoding/encoding.py as vendored by vLLM [ENC]):
- BOS once, then the turns in order.
- Turn 0 opens with `<｜System｜>` when it is a system message or thinking is on; with thinking on
  it then carries "Reasoning Effort: N (range 1-100, …)\\n\\n" before its own text.
- system: `<｜System｜>` (only mid-conversation; turn 0 got it above) + text
  [+ "\\n\\n" + tools section] [+ "\\n\\n## Response Format:…" + response_format JSON].
  A mid-conversation system message counts as a user turn.
- user: `<｜User｜>` + blocks joined by "\\n\\n"; a tool result is `<tool_result>…</tool_result>`.
- assistant: [reasoning + `</think>`] + content [+ DSML calls] + EOS. Reasoning is written only in
  thinking mode, and only after the last user turn unless the prompt lists tools (then always).
- After a user turn (or mid system) that is last or followed by an assistant/reminder:
  `<｜Assistant｜>` + `<think>` (thinking, at or after the last user turn or with tools) else `</think>`.
- A final assistant message is a prefix to continue: no EOS, no header after it.
Tools and response_format go into the leading system message (an empty one is added if the
conversation has none), as vLLM's V4.1 wrapper does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import special_tokens as st
from .chat_errors import ChatEncodingError
from .chat_messages import AssistantTurn, ReminderTurn, SystemTurn, ToolResult, Turn, UserTurn, parse_messages
from .chat_options import parse_response_format, parse_tools, resolve_effort, tools_for_prompt
from .dsml import render_calls, render_tools, to_json
from .segments import Segment, SegmentBuilder, Tokens, spell
from .tokenizer import Tokenizer

EFFORT_PREFIX = "Reasoning Effort: {} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
RESPONSE_FORMAT_PREFIX = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
BLOCK_SEPARATOR = "\n\n"
# The ids the model generated for an assistant body of this exact text, if known (replies.py).
ReplyLookup = Callable[[str], "tuple[int, ...] | None"]


@dataclass(frozen=True)
class RenderedChat:
    segments: list[Segment]
    starts_in_reasoning: bool  # the prompt ends in `<think>`: the output begins as reasoning
    tools_enabled: bool  # the prompt lists tools: parse DSML calls in the output

    def text(self) -> str:
        return spell(self.segments)


@dataclass(frozen=True)
class EncodedChat:
    token_ids: list[int]
    rendered: RenderedChat


def render_chat(messages: Any, *, tools: Any = None, tool_choice: Any = None, response_format: Any = None,
                thinking: bool = True, reasoning_effort: str | int | None = None,
                replies: ReplyLookup | None = None) -> RenderedChat:
    """Render an OpenAI chat request into prompt segments (text runs and special-token ids).

    `thinking` picks the mode; `reasoning_effort` is low/medium/high/max, an int 1-100, or
    "none" (= thinking off); `tool_choice` "none" leaves the tools out of the prompt.
    `replies` maps the exact text of an assistant turn's body (what follows its header, up to
    its EOS) to the ids the model generated for it; a match is spliced in as those ids.
    Raises ChatEncodingError (an HTTP 400) for anything the format cannot carry.
    """
    effort = resolve_effort(thinking, reasoning_effort)
    functions = tools_for_prompt(parse_tools(tools), tool_choice)
    schema = parse_response_format(response_format)
    turns = parse_messages(messages)
    if functions or schema:
        if not isinstance(turns[0], SystemTurn):
            turns.insert(0, SystemTurn(""))
        turns[0].tools, turns[0].response_format = functions, schema
    segments = _render(turns, effort, keep_all_reasoning=bool(functions), replies=replies)
    return RenderedChat(segments, segments[-1] == st.THINK_START.id, bool(functions))


def render_chat_text(messages: Any, **options: Any) -> str:
    """The prompt as one string, special tokens spelled canonically (debugging, tests)."""
    return render_chat(messages, **options).text()


def encode_segments(tokenizer: Tokenizer, segments: list[Segment]) -> list[int]:
    """Token ids of segments: text runs encoded in one batch, special ids and spliced runs kept."""
    texts = [s for s in segments if isinstance(s, str)]
    try:
        encoded = iter(tokenizer.encode_texts(texts))
    except ValueError as exc:
        raise ChatEncodingError(str(exc), "messages") from exc
    ids: list[int] = []
    for segment in segments:
        if isinstance(segment, int):
            ids.append(segment)
        elif isinstance(segment, Tokens):
            ids.extend(segment.ids)
        else:
            ids.extend(next(encoded))
    return ids


def encode_chat(tokenizer: Tokenizer, messages: Any, **options: Any) -> EncodedChat:
    """Render (see render_chat for the options) and tokenize a chat request."""
    rendered = render_chat(messages, **options)
    return EncodedChat(encode_segments(tokenizer, rendered.segments), rendered)


def _render(turns: list[Turn], effort: int | None, keep_all_reasoning: bool,
            replies: ReplyLookup | None = None) -> list[Segment]:
    thinking = effort is not None
    # Mid-conversation system messages count as user turns (official find_last_user_index).
    last_user = max((i for i, t in enumerate(turns) if isinstance(t, UserTurn)
                     or (isinstance(t, SystemTurn) and i > 0)), default=-1)
    out = SegmentBuilder().special(st.BOS)
    for i, turn in enumerate(turns):
        if i == 0 and (thinking or isinstance(turn, SystemTurn)):
            out.special(st.SYSTEM)
            if thinking:
                out.text(EFFORT_PREFIX.format(effort))
        if isinstance(turn, SystemTurn):
            _system(out, turn, is_mid=i > 0)
        elif isinstance(turn, UserTurn):
            out.special(st.USER)
            out.text(BLOCK_SEPARATOR.join(_block_text(b) for b in turn.blocks))
        elif isinstance(turn, ReminderTurn):
            out.special(st.LATEST_REMINDER).text(turn.text)
        else:
            keep = thinking and (keep_all_reasoning or i > last_user)
            _assistant(out, turn, keep_reasoning=keep, is_prefix=i == len(turns) - 1, replies=replies)
        following = turns[i + 1] if i + 1 < len(turns) else None
        asks_reply = isinstance(turn, UserTurn) or (isinstance(turn, SystemTurn) and i > 0)
        if asks_reply and (following is None or isinstance(following, (AssistantTurn, ReminderTurn))):
            opens_thinking = thinking and (keep_all_reasoning or i >= last_user)
            out.special(st.ASSISTANT).special(st.THINK_START if opens_thinking else st.THINK_END)
    return out.build()


def _system(out: SegmentBuilder, turn: SystemTurn, *, is_mid: bool) -> None:
    if is_mid:
        out.special(st.SYSTEM)
    out.text(turn.text)
    if turn.tools:
        out.text(BLOCK_SEPARATOR)
        render_tools(out, turn.tools)
    if turn.response_format is not None:
        out.text(BLOCK_SEPARATOR + RESPONSE_FORMAT_PREFIX + to_json(turn.response_format))


def _block_text(block: str | ToolResult) -> str:
    return block if isinstance(block, str) else f"<tool_result>{block.text}</tool_result>"


def _assistant(out: SegmentBuilder, turn: AssistantTurn, *, keep_reasoning: bool, is_prefix: bool,
               replies: ReplyLookup | None = None) -> None:
    body = SegmentBuilder()
    if keep_reasoning:
        body.text(turn.reasoning).special(st.THINK_END)
    body.text(turn.content)
    if turn.calls:
        render_calls(body, [(c.name, c.params) for c in turn.calls])
    segments = body.build()
    text = spell(segments)
    # The body sits between special tokens (the header before, EOS or the end after), so the
    # splice changes no text run's boundaries: only how the body itself is tokenized.
    ids = replies(text) if replies is not None and text and not out.ends_in_text else None
    if ids:
        out.tokens(Tokens(tuple(ids), text))
    else:
        out.extend(segments)
    if not is_prefix:
        out.special(st.EOS)
