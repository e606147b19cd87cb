"""A reply's output items and the Responses API's stream events, from the chat parser's deltas.

Each delta (reasoning, content, tool-call pieces, as the output parser makes them for chat)
opens, extends and closes output items in the order the model wrote them: a reasoning item,
a message with one output_text part, a function_call item a call. The stream's events say
so (output_item.added, content_part.added, the text's deltas, their .done events,
output_item.done); a whole reply is fed as one delta, so its items are made by the same code
as a stream's.
"""

from __future__ import annotations

from typing import Any

from .responses_items import call_item, message_item, new_id, reasoning_item, text_part

REASONING_PART = {"type": "reasoning_text", "text": ""}
ITEM_ID_PREFIXES = {"reasoning": "rs", "message": "msg", "call": "fc"}


class OutputEvents:
    def __init__(self, seal_reasoning: bool = False):
        self.seal_reasoning = seal_reasoning  # reasoning items carry encrypted_content when done
        self.items: list[dict[str, Any]] = []  # closed items, in output order
        self._sequence = 0
        self._open: str | None = None  # "reasoning", "message" or "call"
        self._text: list[str] = []  # the open item's text (a call's arguments)
        self._id = ""  # the open item's
        self._call: tuple[str, str] | None = None  # the open call's (call id, name)
        self._logprobs: list[dict] = []  # the message's, all
        self._unsent: list[dict] = []  # logprobs that arrived before their text

    def event(self, kind: str, **fields) -> dict[str, Any]:
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def update(self, delta: dict[str, Any] | None, logprobs: list[dict] = ()) -> list[dict[str, Any]]:
        """The events of one chat delta ({reasoning_content, content, tool_calls}); logprobs:
        the message text's tokens among this delta's."""
        self._unsent += logprobs
        events: list[dict[str, Any]] = []
        if not delta:
            return events
        if delta.get("reasoning_content"):
            events += self._extend("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            events += self._extend("message", delta["content"])
        for piece in delta.get("tool_calls") or []:
            function = piece.get("function") or {}
            if piece.get("id"):  # a call's first piece
                events += self._close(complete=True)
                self._call = (piece["id"], function.get("name") or "")
                events += self._open_item("call")
            events += self._extend("call", function.get("arguments") or "")
        return events

    @property
    def opened(self) -> bool:
        """An item is open (its closing events not yet sent)."""
        return self._open is not None

    def finish(self, complete: bool) -> list[dict[str, Any]]:
        """Close the open item (complete: False where the token budget ran out). A reply with
        nothing in it is one empty message."""
        events = [] if self.items or self._open else self._open_item("message")
        return events + self._close(complete)

    # ------------------------------------------------------------------ items

    def _extend(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open != kind:
            events += self._close(complete=True)
            events += self._open_item(kind)
        if not text:
            return events
        self._text.append(text)
        where = self._where()
        if kind == "reasoning":
            events.append(self.event("response.reasoning_text.delta", **where, content_index=0, delta=text))
        elif kind == "message":
            sent, self._unsent = self._unsent, []
            self._logprobs += sent
            events.append(self.event("response.output_text.delta", **where, content_index=0, delta=text,
                                     logprobs=sent))
        else:
            events.append(self.event("response.function_call_arguments.delta", **where, delta=text))
        return events

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._id, "output_index": len(self.items)}

    def _item(self, status: str) -> dict[str, Any]:
        text = "".join(self._text)
        if self._open == "reasoning":
            return reasoning_item(self._id, text, self.seal_reasoning and status != "in_progress")
        if self._open == "message":
            return message_item(self._id, text, self._logprobs, status)
        call_id, name = self._call
        return call_item(self._id, call_id, name, text, status)

    def _open_item(self, kind: str) -> list[dict[str, Any]]:
        self._open, self._text, self._id = kind, [], new_id(ITEM_ID_PREFIXES[kind])
        item = self._item("in_progress")
        if kind != "call":
            item = {**item, "content": []}
        events = [self.event("response.output_item.added", output_index=len(self.items), item=item)]
        if kind == "reasoning":
            events.append(self.event("response.content_part.added", **self._where(), content_index=0,
                                     part=REASONING_PART))
        elif kind == "message":
            events.append(self.event("response.content_part.added", **self._where(), content_index=0,
                                     part=text_part("", [])))
        return events

    def _close(self, complete: bool) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        if self._open == "message":
            self._logprobs += self._unsent
            self._unsent = []
        item = self._item("completed" if complete or self._open == "call" else "incomplete")
        where, text = self._where(), "".join(self._text)
        if self._open == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            events = [self.event("response.reasoning_text.done", **where, content_index=0, text=text),
                      self.event("response.content_part.done", **where, content_index=0, part=part)]
        elif self._open == "message":
            events = [self.event("response.output_text.done", **where, content_index=0, text=text,
                                 logprobs=self._logprobs),
                      self.event("response.content_part.done", **where, content_index=0, part=item["content"][0])]
        else:
            events = [self.event("response.function_call_arguments.done", **where, name=item["name"], arguments=text)]
        events.append(self.event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        self._open, self._text = None, []
        return events
