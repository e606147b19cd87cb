"""What the output parser hands the gateway: OpenAI-shaped deltas and the finished message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCallDelta:
    """One streamed piece of a tool call. The first piece of a call carries id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": self.arguments}
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out.update(id=self.id, type="function")
        if self.name is not None:
            function = {"name": self.name, **function}
        out["function"] = function
        return out


@dataclass
class ParserDelta:
    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning_content or self.content or self.tool_calls)

    def add_call(self, piece: ToolCallDelta) -> None:
        """Append, merging argument pieces of the call that is already last."""
        last = self.tool_calls[-1] if self.tool_calls else None
        if last is not None and last.index == piece.index and piece.id is None:
            last.arguments += piece.arguments
        else:
            self.tool_calls.append(piece)

    def to_openai(self) -> dict[str, Any]:
        """The `delta` object of a chat.completion.chunk (only the fields that changed)."""
        out: dict[str, Any] = {}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.content:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text: the concatenation of every streamed argument piece

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedMessage:
    content: str
    reasoning_content: str
    tool_calls: list[ParsedToolCall]

    @property
    def has_tool_calls(self) -> bool:
        """True when finish_reason should be "tool_calls" (unless generation hit a limit)."""
        return bool(self.tool_calls)

    def to_openai(self) -> dict[str, Any]:
        """The `message` object of a chat.completion."""
        out: dict[str, Any] = {"role": "assistant",
                               "content": self.content if self.content or not self.tool_calls else None}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out
