"""A reply's chat deltas as the blocks a structured API answers with.

The output parser makes chat deltas: pieces of reasoning, of content, and of tool calls (a
call's first piece carries its id and name). The Responses API and Anthropic's Messages API
answer with blocks instead, in the order the model wrote them: its reasoning, its text, one
block a call. `DeltaBlocks` turns deltas into steps (a block opens, takes a piece of text, or
closes) that each API frames as its own events; a whole reply is fed as one delta, so a
whole reply's blocks are made by the same code as a stream's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Block:
    kind: str  # "reasoning", "text" or "call"
    call_id: str = ""  # a call's
    name: str = ""  # a call's function
    parts: list[str] = field(default_factory=list)  # its text (a call's arguments), as it came
    id: str = ""  # the API's id of it, where the API names blocks
    index: int = 0  # its place in the reply's blocks

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class Step:
    action: str  # "open", "text" (a piece of the block's text) or "close"
    block: Block
    piece: str = ""


class DeltaBlocks:
    def __init__(self):
        self.open: Block | None = None
        self.closed: list[Block] = []

    def feed(self, delta: dict[str, Any] | None) -> list[Step]:
        """The steps of one chat delta ({reasoning_content, content, tool_calls})."""
        steps: list[Step] = []
        if not delta:
            return steps
        if delta.get("reasoning_content"):
            steps += self._extend("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            steps += self._extend("text", delta["content"])
        for piece in delta.get("tool_calls") or []:
            function = piece.get("function") or {}
            if piece.get("id"):  # a call's first piece
                steps += self.close()
                steps += self._open(Block("call", piece["id"], function.get("name") or ""))
            steps += self._extend("call", function.get("arguments") or "")
        return steps

    def finish(self) -> list[Step]:
        """Close the open block; a reply with none is one empty text block."""
        steps = [] if self.closed or self.open else self._open(Block("text"))
        return steps + self.close()

    def close(self) -> list[Step]:
        if self.open is None:
            return []
        block, self.open = self.open, None
        self.closed.append(block)
        return [Step("close", block)]

    def _open(self, block: Block) -> list[Step]:
        block.index = len(self.closed)
        self.open = block
        return [Step("open", block)]

    def _extend(self, kind: str, text: str) -> list[Step]:
        steps = []
        if self.open is None or self.open.kind != kind:
            steps += self.close() + self._open(Block(kind))
        if text:
            self.open.parts.append(text)
            steps.append(Step("text", self.open, text))
        return steps
