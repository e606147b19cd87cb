"""A reply's output items and the Responses API's stream events, from its blocks
(delta_blocks.py): a reasoning item, a message with one output_text part, a function_call
item a call. The stream's events say so (output_item.added, content_part.added, the text's
deltas, their .done events, output_item.done)."""

from __future__ import annotations

from typing import Any

from .delta_blocks import Block, DeltaBlocks, Step
from .responses_items import call_item, message_item, new_id, reasoning_item, text_part

REASONING_PART = {"type": "reasoning_text", "text": ""}
ITEM_ID_PREFIXES = {"reasoning": "rs", "text": "msg", "call": "fc"}


class OutputEvents:
    def __init__(self, seal_reasoning: bool = False):
        self.seal_reasoning = seal_reasoning  # reasoning items carry encrypted_content when done
        self.items: list[dict[str, Any]] = []  # closed items, in output order
        self.blocks = DeltaBlocks()
        self._sequence = 0
        self._complete = True  # how the last block closes (the token budget may cut it)
        self._logprobs: list[dict] = []  # the message's, all
        self._unsent: list[dict] = []  # logprobs that arrived before their text

    def event(self, kind: str, **fields) -> dict[str, Any]:
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}

    @property
    def opened(self) -> bool:
        """An item is open (its closing events not yet sent)."""
        return self.blocks.open is not None

    def update(self, delta: dict[str, Any] | None, logprobs: list[dict] = ()) -> list[dict[str, Any]]:
        """The events of one chat delta; logprobs: the message text's tokens among its."""
        self._unsent += logprobs
        return [e for step in self.blocks.feed(delta) for e in self._events(step)]

    def finish(self, complete: bool) -> list[dict[str, Any]]:
        """Close the open item (complete: False where the token budget ran out). A reply with
        nothing in it is one empty message."""
        self._complete = complete
        return [e for step in self.blocks.finish() for e in self._events(step)]

    # ------------------------------------------------------------------ items

    def _item(self, block: Block, status: str) -> dict[str, Any]:
        if block.kind == "reasoning":
            return reasoning_item(block.id, block.text, self.seal_reasoning and status != "in_progress")
        if block.kind == "text":
            return message_item(block.id, block.text, self._logprobs, status)
        return call_item(block.id, block.call_id, block.name, block.text, status)

    def _events(self, step: Step) -> list[dict[str, Any]]:
        block = step.block
        where = {"item_id": block.id, "output_index": block.index}
        if step.action == "open":
            block.id = new_id(ITEM_ID_PREFIXES[block.kind])
            where["item_id"] = block.id
            if block.kind == "call":  # (the steps were all made first: the block may hold text already)
                item = call_item(block.id, block.call_id, block.name, "", "in_progress")
                return [self.event("response.output_item.added", output_index=block.index, item=item)]
            item = {**self._item(block, "in_progress"), "content": []}
            part = REASONING_PART if block.kind == "reasoning" else text_part("", [])
            return [self.event("response.output_item.added", output_index=block.index, item=item),
                    self.event("response.content_part.added", **where, content_index=0, part=part)]
        if step.action == "text":
            if block.kind == "reasoning":
                return [self.event("response.reasoning_text.delta", **where, content_index=0, delta=step.piece)]
            if block.kind == "text":
                sent, self._unsent = self._unsent, []
                self._logprobs += sent
                return [self.event("response.output_text.delta", **where, content_index=0, delta=step.piece,
                                   logprobs=sent)]
            return [self.event("response.function_call_arguments.delta", **where, delta=step.piece)]
        return self._closed(block, where)

    def _closed(self, block: Block, where: dict[str, Any]) -> list[dict[str, Any]]:
        if block.kind == "text":
            self._logprobs += self._unsent
            self._unsent = []
        last = self.blocks.open is None and not self._complete  # (finish closes the last block)
        item = self._item(block, "incomplete" if last and block.kind != "call" else "completed")
        text = block.text
        if block.kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            events = [self.event("response.reasoning_text.done", **where, content_index=0, text=text),
                      self.event("response.content_part.done", **where, content_index=0, part=part)]
        elif block.kind == "text":
            events = [self.event("response.output_text.done", **where, content_index=0, text=text,
                                 logprobs=self._logprobs),
                      self.event("response.content_part.done", **where, content_index=0, part=item["content"][0])]
        else:
            events = [self.event("response.function_call_arguments.done", **where, name=item["name"], arguments=text)]
        events.append(self.event("response.output_item.done", output_index=block.index, item=item))
        self.items.append(item)
        return events
