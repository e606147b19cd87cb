"""Streaming output parser: generated text -> reasoning_content, content and tool_calls.

The model's output (official `parse_message_from_completion_text`, V4.1 tags) is

    [reasoning</think>] content [\\n\\n<｜DSML｜ calls>…</｜DSML｜ calls>]

With thinking on, the prompt ends in `<think>`, so the output starts inside reasoning
(`starts_in_reasoning`, from RenderedChat). Text that may be the start of `</think>` or of a
calls block is held back until the next piece decides; everything else goes out at once.
The official parser asserts on malformed output; this one never raises: broken markup
becomes content (dsml_stream.py says how), and a missing `</think>` leaves it all reasoning.

The streaming path (`feed`/`finish`) and the whole-text path (`parse_completion`) are the
same code, so they agree by construction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from enum import Enum

from . import special_tokens as st
from .dsml import BLOCK_LEAD, CALLS_OPEN
from .dsml_stream import DsmlBlockParser
from .parser_output import ParsedMessage, ParsedToolCall, ParserDelta
from .text_match import partial_suffix_len


class _Mode(Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    CALLS = "calls"


def random_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class OutputParser:
    def __init__(self, *, starts_in_reasoning: bool, tools_enabled: bool = True,
                 new_call_id: Callable[[], str] = random_call_id, max_calls: int | None = None):
        """max_calls: tool calls beyond this many are dropped (parallel_tool_calls: false: one)."""
        self._mode = _Mode.REASONING if starts_in_reasoning else _Mode.CONTENT
        self._tools_enabled = tools_enabled
        self._max_calls = max_calls
        self.dropped_calls = False  # a call past max_calls began: the calls kept are complete
        self._new_call_id = new_call_id
        self._buf = ""
        self._block: DsmlBlockParser | None = None
        self._calls: list[ParsedToolCall] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []

    def feed(self, text: str) -> ParserDelta:
        """Add generated text; return what became certain (may be empty)."""
        self._buf += text
        return self._run(final=False)

    def finish(self) -> tuple[ParserDelta, ParsedMessage]:
        """End of generation: the last delta, and the whole message."""
        delta = self._run(final=True)
        return delta, ParsedMessage("".join(self._content), "".join(self._reasoning), self._calls[:self._max_calls])

    def _run(self, *, final: bool) -> ParserDelta:
        delta = ParserDelta()
        while True:
            if self._mode is _Mode.REASONING:
                at = self._buf.find(st.THINK_END.text)
                if at < 0:
                    delta.reasoning_content += self._take_safe([st.THINK_END.text], final)
                    break
                delta.reasoning_content += self._buf[:at]
                self._buf = self._buf[at + len(st.THINK_END.text):]
                self._mode = _Mode.CONTENT
            elif self._mode is _Mode.CONTENT:
                at = self._buf.find(CALLS_OPEN) if self._tools_enabled else -1
                if at < 0:
                    markers = [BLOCK_LEAD + CALLS_OPEN, CALLS_OPEN] if self._tools_enabled else []
                    delta.content += self._take_safe(markers, final)
                    break
                # The blank line before the block belongs to the markup, not to the content.
                lead = BLOCK_LEAD if self._buf[:at].endswith(BLOCK_LEAD) else ""
                delta.content += self._buf[:at - len(lead)]
                self._block = DsmlBlockParser(lead + CALLS_OPEN, len(self._calls), self._new_call_id)
                self._buf = self._buf[at + len(CALLS_OPEN):]
                self._mode = _Mode.CALLS
            else:
                assert self._block is not None
                step = self._block.feed(self._buf, final=final)
                self._buf = ""
                for piece in step.tool_calls:
                    delta.add_call(piece)
                delta.content += step.content
                if step.rest is None:
                    break
                self._calls.extend(self._block.calls)
                self._block = None
                self._buf = step.rest
                self._mode = _Mode.CONTENT
        if self._max_calls is not None:
            kept = [piece for piece in delta.tool_calls if piece.index < self._max_calls]
            self.dropped_calls |= len(kept) < len(delta.tool_calls)
            delta.tool_calls = kept
        self._reasoning.append(delta.reasoning_content)
        self._content.append(delta.content)
        return delta

    def _take_safe(self, markers: list[str], final: bool) -> str:
        """Remove and return the buffer except an end that may still become a marker."""
        keep = 0 if final else partial_suffix_len(self._buf, markers)
        out, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        return out


def parse_completion(text: str, *, starts_in_reasoning: bool, tools_enabled: bool = True,
                     new_call_id: Callable[[], str] = random_call_id, max_calls: int | None = None) -> ParsedMessage:
    """Parse a whole completion (non-streaming); text after an EOS spelling is ignored."""
    parser = OutputParser(starts_in_reasoning=starts_in_reasoning, tools_enabled=tools_enabled,
                          new_call_id=new_call_id, max_calls=max_calls)
    parser.feed(text.split(st.EOS.text, 1)[0])
    return parser.finish()[1]
