"""Incremental parser for the inside of one `<｜DSML｜ calls>` block (format: dsml.py).

It turns markup into OpenAI tool-call deltas as soon as each part is certain:
- a call's id and name when `<｜DSML｜ invoke name="NAME">` is complete;
- its arguments as JSON text, written as the official decoder writes them
  (`{"k": "v", "n": 5}`): a string value (string="true") streams character by character,
  a JSON value (string="false") goes out whole at its closing tag, verbatim if it is valid
  JSON, else as a JSON string (the markup said JSON but the model did not write any).
Blank text between tags is accepted (the official output has exactly one newline).

Markup that breaks the grammar never raises. If no call of the block was emitted yet, the whole
block so far is handed back as plain content; otherwise the open call's JSON is closed, the
calls already streamed stand, and the text from the broken spot on goes back to content. A
block cut off by the end of generation ends the same way, except that a string value being
streamed is kept and a half-written tag is dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from .dsml import CALLS_CLOSE, INVOKE_CLOSE, INVOKE_OPEN, PARAM_CLOSE, PARAM_OPEN
from .parser_output import ParsedToolCall, ToolCallDelta
from .text_match import partial_suffix_len

_HEADER_END = '">'
_MAX_HEADER_CHARS = 512  # a name longer than this is not a name: give up waiting for its end
_PARAM_HEADER = re.compile(r'([^"\n]*)(?:" string="(true|false))?')
_NO_MATCH = object()  # the text cannot be what was expected here
_CLOSED = object()  # a closing tag was read


class _State(Enum):
    BETWEEN_CALLS = "between_calls"  # expect an invoke or the end of the block
    IN_CALL = "in_call"  # expect a parameter or the end of the invoke
    IN_VALUE = "in_value"  # inside a parameter value
    DONE = "done"  # the block closed or broke; `rest` is the text after it


@dataclass
class BlockStep:
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    content: str = ""  # markup handed back as plain text
    rest: str | None = None  # set when the block is over: unparsed text that follows it


def _json_text(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def _is_json(text: str) -> bool:
    try:
        json.loads(text, parse_constant=lambda name: 1 / 0)  # refuse NaN/Infinity, not JSON
    except (ValueError, ZeroDivisionError):
        return False
    return True


class DsmlBlockParser:
    def __init__(self, opening: str, first_index: int, new_call_id: Callable[[], str]):
        self._buf = ""
        self._state = _State.BETWEEN_CALLS
        self._raw: str | None = opening  # the block's text while nothing of it was emitted
        self._first_index = first_index
        self._new_call_id = new_call_id
        self.calls: list[ParsedToolCall] = []
        self._num_params = 0
        self._value_key = ""
        self._value_is_string = False
        self._step = BlockStep()

    def feed(self, text: str, *, final: bool = False) -> BlockStep:
        self._buf += text
        self._step = step = BlockStep()
        handlers = {_State.BETWEEN_CALLS: self._between_calls, _State.IN_CALL: self._in_call,
                    _State.IN_VALUE: self._in_value}
        while self._state is not _State.DONE and handlers[self._state]():
            pass
        if final and self._state is not _State.DONE:
            self._cut_off()
        if self._state is _State.DONE:
            step.rest, self._buf = self._buf, ""
        return step

    # ---- states: each returns True when it consumed something and may go on ---------------

    def _between_calls(self) -> bool:
        name = self._element(INVOKE_OPEN, CALLS_CLOSE)
        if name is _CLOSED:
            self._state = _State.DONE
            return True
        if not isinstance(name, str) or not name:  # a call without a name is broken too
            return self._wait_or_fail(_NO_MATCH if name == "" else name)
        self._consume(len(INVOKE_OPEN) + len(name) + len(_HEADER_END))
        call = ParsedToolCall(self._new_call_id(), name, "")
        self.calls.append(call)
        self._raw = None  # from here on the block has been streamed as tool calls
        self._step.tool_calls.append(ToolCallDelta(self._index, call.id, name, ""))
        self._num_params = 0
        self._state = _State.IN_CALL
        return True

    def _in_call(self) -> bool:
        header = self._element(PARAM_OPEN, INVOKE_CLOSE)
        if header is _CLOSED:
            self._close_call()
            self._state = _State.BETWEEN_CALLS
            return True
        parsed = _PARAM_HEADER.fullmatch(header) if isinstance(header, str) else None
        if parsed is None:
            return self._wait_or_fail(_NO_MATCH if isinstance(header, str) else header)
        self._consume(len(PARAM_OPEN) + len(header) + len(_HEADER_END))
        self._value_key = parsed.group(1)
        self._value_is_string = parsed.group(2) == "true"
        if self._value_is_string:
            self._emit(self._key_prefix() + '"')
        self._state = _State.IN_VALUE
        return True

    def _in_value(self) -> bool:
        end = self._buf.find(PARAM_CLOSE)
        if end < 0:
            if self._value_is_string:  # stream what cannot be the start of the closing tag
                ready = len(self._buf) - partial_suffix_len(self._buf, [PARAM_CLOSE])
                self._emit(json.dumps(self._buf[:ready], ensure_ascii=False)[1:-1])
                self._consume(ready)
            return False
        value = self._buf[:end]
        self._consume(end + len(PARAM_CLOSE))
        if self._value_is_string:
            self._emit(json.dumps(value, ensure_ascii=False)[1:-1] + '"')
        else:
            self._emit(self._key_prefix() + (value if _is_json(value) else json.dumps(value, ensure_ascii=False)))
        self._num_params += 1
        self._state = _State.IN_CALL
        return True

    # ---- helpers ------------------------------------------------------------------------

    @property
    def _index(self) -> int:
        return self._first_index + len(self.calls) - 1

    def _element(self, open_tag: str, close_tag: str) -> str | None | object:
        """After blanks: _CLOSED (consumed) for `close_tag`; for `open_tag` its attribute text
        up to '">' (not consumed); None while the text may still become either; else _NO_MATCH."""
        self._consume(len(self._buf) - len(self._buf.lstrip()))
        if self._buf.startswith(close_tag):
            self._consume(len(close_tag))
            return _CLOSED
        if not self._buf.startswith(open_tag):
            return None if close_tag.startswith(self._buf) or open_tag.startswith(self._buf) else _NO_MATCH
        end = self._buf.find(_HEADER_END, len(open_tag))
        if end < 0:
            partial = self._buf[len(open_tag):]
            return _NO_MATCH if "\n" in partial or len(partial) > _MAX_HEADER_CHARS else None
        header = self._buf[len(open_tag):end]
        return _NO_MATCH if "\n" in header else header

    def _key_prefix(self) -> str:
        return ("{" if self._num_params == 0 else ", ") + _json_text(self._value_key) + ": "

    def _emit(self, arguments: str) -> None:
        if arguments:
            self.calls[-1].arguments += arguments
            self._step.tool_calls.append(ToolCallDelta(self._index, arguments=arguments))

    def _close_call(self) -> None:
        if self._state is _State.IN_VALUE and self._value_is_string:
            self._emit('"')
            self._num_params += 1
        self._emit("}" if self._num_params else "{}")

    def _consume(self, n: int) -> None:
        if self._raw is not None:
            self._raw += self._buf[:n]
        self._buf = self._buf[n:]

    def _wait_or_fail(self, outcome: object) -> bool:
        """A tag or header is incomplete (None: wait for more text) or broken (fail)."""
        return False if outcome is None else self._fail()

    def _fail(self) -> bool:
        """Broken markup: hand the unstreamed block back as text, or close the open call."""
        if self._raw is not None:
            self._step.content += self._raw
        elif self._state in (_State.IN_CALL, _State.IN_VALUE):
            self._close_call()
        self._state = _State.DONE
        return False

    def _cut_off(self) -> None:
        """Generation ended inside the block."""
        if self._state is _State.IN_VALUE and self._value_is_string:
            self._emit(json.dumps(self._buf, ensure_ascii=False)[1:-1])
            self._buf = ""
        if self._raw is None:
            self._buf = ""  # a half-written tag of a streamed call is not content
        self._fail()
