"""What the typed-stream APIs' tests (Responses, Messages) script and read: the token ids a
scripted decode worker sends (reasoning, text, DSML calls), and the events of a stream."""

from __future__ import annotations

import json

import httpx
from pydantic import TypeAdapter

from dsflash.gateway import special_tokens as st
from dsflash.gateway.chat_encoding import encode_segments
from dsflash.gateway.dsml import render_calls
from dsflash.gateway.segments import SegmentBuilder, spell


def text_ids(tok, text: str) -> list[int]:
    return encode_segments(tok, [text])


def chunked(ids: list[int], size: int = 2) -> list[list[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def reply_ids(tok, reasoning: str, text: str = "", calls=()) -> list[int]:
    """A thinking reply: its reasoning, `</think>`, its text, its DSML calls ((name, args)), EOS."""
    out = text_ids(tok, reasoning) + [st.THINK_END.id] + (text_ids(tok, text) if text else [])
    if calls:
        block = SegmentBuilder()
        render_calls(block, list(calls))
        out += text_ids(tok, spell(block.build()))
    return out + [st.EOS.id]


def says(tok, text: str):
    """A scripted worker's script: every request answered with `text`, then EOS."""
    reply = [text_ids(tok, text), [st.EOS.id]]
    return lambda request: (reply, "stop")


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def sdk_valid(kind, value):
    """`value` as an SDK's pydantic type `kind` validates it: every field the SDK requires, of
    its type (the clients themselves read replies without validating them)."""
    return TypeAdapter(kind).validate_python(value)


def typed_events(url: str, body: dict, event_type=None) -> list[dict]:
    """A typed stream's events (`event:` then `data:` lines), each checked against its line's
    name and, given the SDK's union `event_type`, validated (error events aside)."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert "[DONE]" not in raw  # typed streams end with their last event
    events = []
    for block in raw.split("\n\n"):
        if block.startswith("event: "):
            name, data = block.split("\n", 1)
            event = json.loads(data[len("data: "):])
            assert name == f"event: {event['type']}"
            if event_type is not None and event["type"] != "error":
                sdk_valid(event_type, event)
            events.append(event)
    return events
