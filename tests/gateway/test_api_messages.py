"""Anthropic's Messages API (/v1/messages) against a scripted decode worker, through the
official `anthropic` client: content blocks whole and streamed (the SDK's own accumulator
reads the stream), the prompt a tool loop renders (the same ids as the equivalent chat
completion's), thinking's switch and budget, stop reasons, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import grpc
import httpx
import pytest

from dsflash.gateway import special_tokens as st
from dsflash.gateway.endpoints import GatewaySettings
from tests.support.gateway_harness import ScriptedGateway
from tests.support.scripted_replies import chunked, reply_ids, says, sdk_valid, text_ids, typed_events, without_ids

TOOL = {"name": "get_weather", "description": "weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                              "parameters": TOOL["input_schema"]}}
USER = [{"role": "user", "content": "weather?"}]
THINK = {"type": "enabled", "budget_tokens": 8000}


def _call_reply(tok) -> list[int]:
    return reply_ids(tok, "Need the weather.", "Checking.", [("get_weather", {"city": "Paris"})])


def _client(gw, key="x"):
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def _events(gw, body) -> list[dict]:
    return typed_events(f"{gw.url}/v1/messages", body, anthropic.types.RawMessageStreamEvent)


def test_thinking_text_and_a_call_whole_and_streamed(tok):
    ids = _call_reply(tok)
    gw = ScriptedGateway(lambda r: (chunked(ids), "stop"))
    try:
        client = _client(gw)
        options = dict(model="m", max_tokens=200, messages=USER, tools=[TOOL], thinking=THINK)
        whole = client.messages.create(**options)
        sdk_valid(anthropic.types.Message, whole.model_dump(exclude_unset=True))
        assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
        assert whole.content[0].thinking == "Need the weather." and whole.content[1].text == "Checking."
        assert whole.content[2].name == "get_weather" and whole.content[2].input == {"city": "Paris"}
        assert whole.stop_reason == "tool_use" and whole.stop_sequence is None
        prompt = list(gw.backend.requests[-1].token_ids)
        assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == len(prompt)
        assert whole.usage.cache_read_input_tokens == 3 and whole.usage.output_tokens == len(ids)
        assert client.messages.count_tokens(model="m", messages=USER, tools=[TOOL], thinking=THINK).input_tokens \
            == len(prompt)
        with client.messages.stream(**options) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert without_ids(final.model_dump(exclude_unset=True)["content"]) == \
            without_ids(whole.model_dump(exclude_unset=True)["content"])
        assert final.stop_reason == "tool_use" and final.usage.output_tokens == len(ids)
        events = _events(gw, {**options, "tools": [TOOL]})
        starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        assert starts == ["thinking", "text", "tool_use"]
        assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2]
    finally:
        gw.close()


def test_a_tool_loop_renders_as_the_chat_completion_would(tok):
    """Turn two (the call's result; the assistant's thinking, text and call sent back) reaches
    the worker as the same ids as the equivalent chat completion's, system prompt included."""
    ids = _call_reply(tok)
    gw = ScriptedGateway(lambda r: (chunked(ids), "stop"))
    try:
        client = _client(gw)
        first = client.messages.create(model="m", max_tokens=200, messages=USER, tools=[TOOL], thinking=THINK,
                                       system="Be brief.")
        call = first.content[2]
        history = USER + [{"role": "assistant", "content": [b.model_dump(exclude_unset=True) for b in first.content]},
                          {"role": "user", "content": [
                              {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"},
                              {"type": "text", "text": "And tomorrow?"}]}]
        client.messages.create(model="m", max_tokens=200, messages=history, tools=[TOOL], thinking=THINK,
                               system=[{"type": "text", "text": "Be brief."}])
        looped = list(gw.backend.requests[-1].token_ids)
        chat = [{"role": "system", "content": "Be brief."}, *USER,
                {"role": "assistant", "content": "Checking.", "reasoning_content": "Need the weather.",
                 "tool_calls": [{"id": call.id, "type": "function",
                                 "function": {"name": "get_weather", "arguments": json.dumps(call.input)}}]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
                {"role": "user", "content": "And tomorrow?"}]
        httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": chat, "tools": [CHAT_TOOL],
                                                           "reasoning_effort": "high"}, timeout=30)
        assert list(gw.backend.requests[-1].token_ids) == looped
        assert "Need the weather." in tok.decode(looped)  # (tools keep the reasoning in the history)
    finally:
        gw.close()


def test_thinking_is_off_unless_asked_and_its_budget_picks_the_effort(tok):
    gw = ScriptedGateway(says(tok, "ok"))
    try:
        client = _client(gw)

        def prompt(via_chat=False, **options) -> list[int]:
            if via_chat:
                httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": USER, **options}, timeout=30)
            else:
                client.messages.create(model="m", max_tokens=10, messages=USER, **options)
            return list(gw.backend.requests[-1].token_ids)

        assert prompt() == prompt(True, thinking={"type": "disabled"})
        assert prompt(thinking={"type": "disabled"}) == prompt()
        for budget, effort in ((1024, "low"), (8000, "high"), (32000, "max")):
            assert prompt(thinking={"type": "enabled", "budget_tokens": budget}) == \
                prompt(True, reasoning_effort=effort), budget
    finally:
        gw.close()


def test_stop_reasons(tok):
    ids = text_ids(tok, "one two three four") + [st.EOS.id]
    gw = ScriptedGateway(lambda r: (chunked(ids, 1), "length" if r.sampling.max_tokens == 2 else "stop"))
    try:
        client = _client(gw)
        ended = client.messages.create(model="m", max_tokens=50, messages=USER)
        assert ended.stop_reason == "end_turn" and ended.content[0].text == "one two three four"
        stopped = client.messages.create(model="m", max_tokens=50, messages=USER, stop_sequences=[" three"])
        assert (stopped.stop_reason, stopped.stop_sequence, stopped.content[0].text) == ("stop_sequence", " three",
                                                                                         "one two")
        cut = client.messages.create(model="m", max_tokens=2, messages=USER)
        assert cut.stop_reason == "max_tokens"
        events = _events(gw, {"model": "m", "max_tokens": 50, "messages": USER, "stop_sequences": [" three"]})
        delta = [e for e in events if e["type"] == "message_delta"][0]
        assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": " three"}
    finally:
        gw.close()


@pytest.mark.parametrize("body, where", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": None}, "max_tokens"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "user", "content": []}]}, "messages"),
])
def test_errors_take_anthropics_shape(tok, body, where):
    gw = ScriptedGateway(lambda r: ([[st.EOS.id]], "stop"))
    try:
        r = httpx.post(f"{gw.url}/v1/messages", json={"model": "m", "max_tokens": 10, "messages": USER, **body},
                       timeout=30)
        assert r.status_code == 400 and r.json()["type"] == "error", r.json()
        assert r.json()["error"]["type"] == "invalid_request_error" and where in r.json()["error"]["message"]
        assert not gw.backend.requests
    finally:
        gw.close()


def test_keys_unknown_paths_and_a_failing_worker(tok):
    """Anthropic's clients send x-api-key; a refusal, an unknown path under /v1/messages and a
    worker's failure mid-stream all answer in Anthropic's shape."""
    settings = GatewaySettings(api_keys=("k1",), keepalive_s=0.2)
    gw = ScriptedGateway(lambda r: ([text_ids(tok, "partial"), grpc.StatusCode.UNAVAILABLE], "stop"), settings=settings)
    try:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            _client(gw, key="nope").messages.create(model="m", max_tokens=10, messages=USER)
        assert refused.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.InternalServerError) as failed:  # (a 503 the worker gave)
            _client(gw, key="k1").messages.create(model="m", max_tokens=10, messages=USER)
        assert failed.value.body["error"]["type"] == "overloaded_error"
        missing = httpx.post(f"{gw.url}/v1/messages/batches", headers={"x-api-key": "k1"}, json={})
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        with httpx.stream("POST", f"{gw.url}/v1/messages", headers={"x-api-key": "k1"}, timeout=30,
                          json={"model": "m", "max_tokens": 10, "messages": USER, "stream": True}) as r:
            raw = r.read().decode()
        last = json.loads(raw.strip().split("\n\n")[-1].split("data: ", 1)[1])
        assert last["type"] == "error" and last["error"]["type"] == "overloaded_error"
        openai_shape = httpx.post(f"{gw.url}/v1/chat/completions", headers={"x-api-key": "nope"}, json={})
        assert openai_shape.status_code == 401 and "code" in openai_shape.json()["error"]  # other paths: OpenAI's
    finally:
        gw.close()


def test_what_anthropics_clients_also_send(tok):
    """Assistant messages in a row are one turn; output_config's effort and format; a tool
    typed null; thinking shown "omitted" (the signature carries the text into the next turn);
    413 and 504 in Anthropic's types."""
    from dsflash.gateway.errors import APIError

    ids = reply_ids(tok, "Hidden thought.", "Shown.")
    gw = ScriptedGateway(lambda r: (chunked(ids), "stop"), settings=GatewaySettings(max_body_bytes=4096))
    try:
        client = _client(gw)

        def prompt(via_chat=False, **options) -> list[int]:
            if via_chat:
                httpx.post(f"{gw.url}/v1/chat/completions", json=options, timeout=30)
            else:
                client.messages.create(model="m", max_tokens=10, **options)
            return list(gw.backend.requests[-1].token_ids)

        two = prompt(messages=USER + [{"role": "assistant", "content": "A1"}, {"role": "assistant", "content": "A2"}])
        assert two == prompt(True, messages=USER + [{"role": "assistant", "content": "A1\n\nA2"}],
                             thinking={"type": "disabled"})
        thinking = {"type": "adaptive"}
        assert prompt(messages=USER, thinking=thinking, extra_body={"output_config": {"effort": "low"}}) == \
            prompt(True, messages=USER, reasoning_effort="low")
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        output = {"format": {"type": "json_schema", "schema": schema}}
        assert prompt(messages=USER, extra_body={"output_config": output}) == prompt(
            True, messages=USER, thinking={"type": "disabled"},
            response_format={"type": "json_schema", "json_schema": {"schema": schema}})
        assert prompt(messages=USER, tools=[{**TOOL, "type": None}]) == prompt(messages=USER, tools=[TOOL])
        hidden = client.messages.create(model="m", max_tokens=50, messages=USER,
                                        thinking={"type": "enabled", "budget_tokens": 2000, "display": "omitted"})
        assert hidden.content[0].thinking == "" and hidden.content[1].text == "Shown."
        events = _events(gw, {"model": "m", "max_tokens": 50, "messages": USER,
                              "thinking": {"type": "enabled", "budget_tokens": 2000, "display": "omitted"}})
        assert not any(e.get("delta", {}).get("type") == "thinking_delta" for e in events)
        back = USER + [{"role": "assistant", "content": [b.model_dump(exclude_unset=True) for b in hidden.content]},
                       {"role": "user", "content": "more"}]
        client.messages.create(model="m", max_tokens=50, messages=back, tools=[TOOL],
                               thinking={"type": "enabled", "budget_tokens": 8000})
        assert "Hidden thought." in tok.decode(list(gw.backend.requests[-1].token_ids))  # (tools keep reasoning)
        big = httpx.post(f"{gw.url}/v1/messages", content=b"x" * 5000, timeout=30)
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
        assert APIError(504, "slow", type="timeout").anthropic_body()["error"]["type"] == "timeout_error"
    finally:
        gw.close()
