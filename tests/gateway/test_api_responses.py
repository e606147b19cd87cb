"""OpenAI's Responses API (/v1/responses) against a scripted decode worker, through the
official `openai` client: output items whole and streamed, the prompt a chain of stored
responses renders (the same ids as the equivalent chat completion's), storage in memory and
in a real Redis, and the 4xx of what is not served."""

from __future__ import annotations

import json

import grpc
import httpx
import openai
import pytest

from dsflash.gateway import special_tokens as st
from dsflash.gateway.dsml import render_calls
from dsflash.gateway.response_store import RedisResponseStore
from dsflash.gateway.responses_items import chat_messages
from dsflash.gateway.responses_stream import OutputEvents
from dsflash.gateway.segments import SegmentBuilder, spell
from tests.support.gateway_harness import ScriptedGateway
from tests.support.scripted_replies import chunked, reply_ids, says, sdk_valid, text_ids, typed_events, without_ids

TOOL = {"type": "function", "name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}


def _thought_and_text(tok):
    return reply_ids(tok, "Let me think.", "Hello there!")


def _call_reply(tok):
    return reply_ids(tok, "Need the weather.", calls=[("get_weather", {"city": "Paris"})])


def _client(gw):
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)


def _events(gw, body) -> list[dict]:
    return typed_events(f"{gw.url}/v1/responses", body, openai.types.responses.ResponseStreamEvent)


def test_reasoning_and_text_whole_and_streamed(tok):
    ids = _thought_and_text(tok)
    gw = ScriptedGateway(lambda r: (chunked(ids), "stop"))
    try:
        client = _client(gw)
        whole = client.responses.create(model="m", input="hi", instructions="Be brief.")
        assert [item.type for item in whole.output] == ["reasoning", "message"]
        assert whole.output[0].content[0].text == "Let me think." and whole.output_text == "Hello there!"
        assert whole.status == "completed" and whole.instructions == "Be brief."
        prompt = list(gw.backend.requests[-1].token_ids)
        assert whole.usage.input_tokens == len(prompt) and whole.usage.output_tokens == len(ids)
        assert whole.usage.output_tokens_details.reasoning_tokens == ids.index(st.THINK_END.id) + 1
        assert whole.usage.input_tokens_details.cached_tokens == 3  # as the scripted worker reports
        sdk_valid(openai.types.responses.Response, whole.model_dump(exclude_unset=True))
        # instructions are a system message before the input: the chat completion's prompt
        chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        client.chat.completions.create(model="m", messages=chat)
        assert list(gw.backend.requests[-1].token_ids) == prompt

        events = _events(gw, {"model": "m", "input": "hi", "instructions": "Be brief."})
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        kinds = [e["type"] for e in events]
        item_events = ["response.output_item.added", "response.content_part.added"]
        assert kinds == (["response.created", "response.in_progress"] + item_events
                         + ["response.reasoning_text.delta"] * kinds.count("response.reasoning_text.delta")
                         + ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
                         + item_events + ["response.output_text.delta"] * kinds.count("response.output_text.delta")
                         + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                            "response.completed"])
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello there!"
        final = events[-1]["response"]
        assert final["id"] == events[0]["response"]["id"] and final["status"] == "completed"
        assert final["output"] == [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert without_ids(final["output"]) == without_ids(whole.model_dump(exclude_unset=True)["output"])
        # the SDK reads the stream into its typed events
        streamed = list(client.responses.create(model="m", input="hi", stream=True))
        assert streamed[-1].type == "response.completed" and streamed[-1].response.output_text == "Hello there!"
    finally:
        gw.close()


def test_a_tool_call_continued_renders_as_the_chat_completion_would(tok):
    """Turn two (the call's output, by previous_response_id) reaches the worker as the same
    ids as a chat completion that sends the whole history, reasoning included (tools keep it)."""
    ids = _call_reply(tok)
    gw = ScriptedGateway(lambda r: (chunked(ids), "stop"))
    try:
        client = _client(gw)
        first = client.responses.create(model="m", input="weather?", tools=[TOOL])
        assert [item.type for item in first.output] == ["reasoning", "function_call"]
        call = first.output[1]
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        assert call.call_id.startswith("call_") and call.status == "completed"
        assert first.status == "completed"
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        client.responses.create(model="m", input=[output], tools=[TOOL], previous_response_id=first.id)
        continued = list(gw.backend.requests[-1].token_ids)
        history = [{"role": "user", "content": "weather?"},
                   {"role": "assistant", "content": "", "reasoning_content": "Need the weather.", "tool_calls": [
                       {"id": call.call_id, "type": "function",
                        "function": {"name": "get_weather", "arguments": call.arguments}}]},
                   {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
        client.chat.completions.create(model="m", messages=history, tools=[CHAT_TOOL])
        assert list(gw.backend.requests[-1].token_ids) == continued
        # a client that keeps the history itself sends the output items back as input: the same prompt
        items = [{"role": "user", "content": "weather?"}, *first.model_dump(exclude_unset=True)["output"], output]
        client.responses.create(model="m", input=items, tools=[TOOL])
        assert list(gw.backend.requests[-1].token_ids) == continued
        # streamed, the call's arguments arrive as deltas
        events = _events(gw, {"model": "m", "input": "weather?", "tools": [TOOL]})
        args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert json.loads(args) == {"city": "Paris"} and done[0]["arguments"] == args
        assert done[0]["name"] == "get_weather"
    finally:
        gw.close()


def test_the_next_turn_goes_to_the_conversation_that_holds_the_cache(tok):
    gw = ScriptedGateway(says(tok, "ok"))
    try:
        client = _client(gw)
        first = client.responses.create(model="m", input="one", extra_body={"thinking": {"type": "disabled"}})
        conversation = gw.backend.requests[-1].conversation_id
        client.responses.create(model="m", input="two", previous_response_id=first.id, user="someone",
                                extra_body={"thinking": {"type": "disabled"}})
        assert conversation and gw.backend.requests[-1].conversation_id == conversation  # (the chain's, not user's)
        prompt = tok.decode(list(gw.backend.requests[-1].token_ids))
        assert prompt.index("one") < prompt.index("ok") < prompt.index("two")
        keyed = client.responses.create(model="m", input="one", prompt_cache_key="shared-docs")
        assert gw.backend.requests[-1].conversation_id != "shared-docs" and keyed.prompt_cache_key == "shared-docs"
        # an explicit null is the field's default, in every endpoint's sampling fields
        nulls = {"temperature": None, "top_p": None, "stream": None, "store": None, "max_output_tokens": None}
        r = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "x", **nulls}, timeout=30)
        assert r.status_code == 200 and r.json()["temperature"] == 1.0 and r.json()["store"] is True
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                               "temperature": None, "n": None}, timeout=30)
        assert r.status_code == 200
    finally:
        gw.close()


def test_stored_responses_are_read_listed_and_deleted(tok):
    gw = ScriptedGateway(says(tok, "ok"))
    try:
        client = _client(gw)
        first = client.responses.create(model="m", input=[{"role": "user", "content": "one"},
                                                          {"role": "user", "content": "two", "id": None}])
        read = client.responses.retrieve(first.id)
        assert read.model_dump() == first.model_dump()
        listed = client.responses.input_items.list(first.id, order="asc")
        assert [item.content[0].text for item in listed.data] == ["one", "two"] and not listed.has_more
        assert {(item.type, item.status, item.content[0].type) for item in listed.data} == {
            ("message", "completed", "input_text")}  # stored as OpenAI stores an easy message
        assert all(item.id for item in listed.data)
        page = httpx.get(f"{gw.url}/v1/responses/{first.id}/input_items", params={"limit": 1}).json()
        assert [item["content"][0]["text"] for item in page["data"]] == ["two"] and page["has_more"]
        after = httpx.get(f"{gw.url}/v1/responses/{first.id}/input_items", params={"after": page["last_id"]}).json()
        assert [item["content"][0]["text"] for item in after["data"]] == ["one"]
        for limit in ("0", "²", "١"):  # (non-ASCII digits too)
            bad = httpx.get(f"{gw.url}/v1/responses/{first.id}/input_items", params={"limit": limit})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
        assert client.responses.delete(first.id) is None  # (the SDK returns nothing for a delete)
        for call in (lambda: client.responses.retrieve(first.id), lambda: client.responses.delete(first.id)):
            with pytest.raises(openai.NotFoundError):
                call()
        with pytest.raises(openai.BadRequestError) as gone:
            client.responses.create(model="m", input="three", previous_response_id=first.id)
        assert gone.value.body["code"] == "previous_response_not_found"
        unstored = client.responses.create(model="m", input="one", store=False)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(unstored.id)
    finally:
        gw.close()


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": "a"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                   "arguments": {"a": 1}}]}, "input[1].arguments"),
    ({"tools": [{"type": "function", "name": ""}]}, "tools[0].name"),  # (chat's tools[0].function.name)
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"n": 2}, "n"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"max_output_tokens": 2_000_000}, "max_output_tokens"),
    ({"input": []}, "input"),
    ({"input": [{"type": ["message"], "role": "user", "content": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": ["input_text"], "text": "x"}]}]}, "input[0].content[0].type"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": ["get_weather"]}}, "tool_choice"),
    ({"input": [{"id": "m1", "role": "user", "content": "a"}, {"id": "m1", "role": "user", "content": "b"}]},
     "input[1].id"),
    ({"metadata": {"k": "\ud800"}}, None),  # (unpaired surrogates: the body's, not one field's)
    ({"metadata": {"k": [[[[[]]]]] }}, "metadata.k"),
    ({"user": "a\ud800"}, None),
])
def test_what_is_not_served_is_a_400_naming_its_field(tok, body, param):
    gw = ScriptedGateway(lambda r: ([[st.EOS.id]], "stop"))
    try:
        sent = json.dumps({"model": "m", "input": "hi", **body})  # (ASCII: escapes an unpaired surrogate)
        r = httpx.post(f"{gw.url}/v1/responses", content=sent, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()
        assert param is not None or r.json()["error"]["code"] == "invalid_unicode"
        assert not gw.backend.requests  # nothing reached a worker
    finally:
        gw.close()


def test_a_cut_reply_is_incomplete_and_logprobs_cover_its_text(tok):
    ids = _thought_and_text(tok)[:-2]  # cut inside the text: max_output_tokens ran out
    gw = ScriptedGateway(lambda r: (chunked(ids), "length"))
    try:
        body = dict(model="m", input="hi", max_output_tokens=len(ids), include=["message.output_text.logprobs"],
                    top_logprobs=1)
        whole = _client(gw).responses.create(**body)
        assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
        message = whole.output[-1]
        assert message.status == "incomplete"
        text_tokens = len(ids) - ids.index(st.THINK_END.id) - 1  # not the reasoning's
        assert len(message.content[0].logprobs) == text_tokens
        assert message.content[0].logprobs[0].top_logprobs[0].logprob == -0.5
        assert gw.backend.requests[-1].sampling.top_logprobs == 1
        events = _events(gw, body)
        assert events[-1]["type"] == "response.incomplete"
        streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
        assert streamed == events[-1]["response"]["output"][-1]["content"][0]["logprobs"]
        assert len(streamed) == text_tokens
    finally:
        gw.close()


def test_a_worker_failing_mid_stream_fails_the_response(tok):
    gw = ScriptedGateway(lambda r: ([text_ids(tok, "partial"), grpc.StatusCode.UNAVAILABLE], "stop"))
    try:
        events = _events(gw, {"model": "m", "input": "hi", "thinking": {"type": "disabled"}})
        assert events[-1]["type"] == "response.failed"
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error" and failed["error"]["message"]
        # the message the worker had begun is closed, incomplete, and is the failed response's output
        assert [e["type"] for e in events[-3:-1]] == ["response.content_part.done", "response.output_item.done"]
        assert failed["output"] == [events[-2]["item"]] and failed["output"][0]["status"] == "incomplete"
        assert failed["output"][0]["content"][0]["text"] == "partial"
        r = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
        assert r.status_code == 503
    finally:
        gw.close()


def test_two_gateways_share_stored_responses_through_redis(tok, redis_server):
    """A turn may reach another gateway replica: with Redis it continues the first one's
    response. A Redis that stops answering gives a 503 naming the store, never a hang, and a
    reply that could not be stored still reaches the client."""
    gateways = [ScriptedGateway(says(tok, "ok")) for _ in range(2)]
    for gw in gateways:
        gw.ctx.responses = RedisResponseStore.from_url(redis_server.url)
    try:
        a, b = (_client(gw) for gw in gateways)
        first = a.responses.create(model="m", input="one", extra_body={"thinking": {"type": "disabled"}})
        assert b.responses.retrieve(first.id).output_text == "ok"
        b.responses.create(model="m", input="two", previous_response_id=first.id,
                           extra_body={"thinking": {"type": "disabled"}})
        prompt = tok.decode(list(gateways[1].backend.requests[-1].token_ids))
        assert prompt.index("one") < prompt.index("ok") < prompt.index("two")
        redis_server.pause()
        try:
            r = httpx.get(f"{gateways[0].url}/v1/responses/{first.id}", timeout=30)
            assert r.status_code == 503 and r.json()["error"]["code"] == "response_store_unavailable"
            r = httpx.post(f"{gateways[0].url}/v1/responses", json={"model": "m", "input": "x"}, timeout=30)
            assert r.status_code == 200 and r.json()["output"][-1]["content"][0]["text"]
            r = httpx.post(f"{gateways[0].url}/v1/responses", json={"model": "m", "input": "x",
                                                                    "previous_response_id": first.id}, timeout=30)
            assert r.status_code == 503 and r.json()["error"]["code"] == "response_store_unavailable"
        finally:
            redis_server.resume()
    finally:
        for gw in gateways:
            gw.close()


# ------------------------------------------------------------------ units


def test_a_streamed_reply_and_the_whole_one_make_the_same_items():
    deltas = [{"reasoning_content": "thin"}, {"reasoning_content": "king"}, {"content": "Hi "},
              {"content": "there",
               "tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 1}"}}]},
              {"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}]}]
    streamed = OutputEvents()
    for delta in deltas:
        streamed.update(delta)
    streamed.finish(complete=True)
    whole = OutputEvents()
    whole.update({"reasoning_content": "thinking", "content": "Hi there", "tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
        {"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}]})
    whole.finish(complete=True)
    assert without_ids(streamed.items) == without_ids(whole.items)
    assert [i["type"] for i in whole.items] == ["reasoning", "message", "function_call", "function_call"]
    assert len({i["id"] for i in streamed.items}) == 4
    empty = OutputEvents()
    assert [e["type"] for e in empty.finish(complete=False)][-1] == "response.output_item.done"
    assert empty.items[0]["status"] == "incomplete" and empty.items[0]["content"][0]["text"] == ""


def test_input_items_become_chat_turns():
    form = chat_messages([
        ("input[0]", {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]}),
        ("input[1]", {"role": "user", "content": "q"}),
        ("input[2]", {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}),
        ("input[3]", {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}),
        ("input[4]", {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
        ("input[5]", {"type": "function_call_output", "call_id": "c1", "output": "r"}),
        ("input[6]", {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}),
        ("input[7]", {"type": "message", "role": "assistant", "content": "and more"}),  # (an item after: apart)
    ], instructions="sys")
    assert form.messages == [
        {"role": "system", "content": "sys"}, {"role": "developer", "content": "rules"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "s", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "no\n\nand more", "reasoning_content": "", "tool_calls": []}]
    assert form.sources == ["instructions", "input[0]", "input[1]", "input[2]", "input[5]", "input[6]"]


def test_a_streamed_updates_logprobs_are_split_where_it_was_made(tok):
    """The relay runs ahead of the stream: by the time an update is framed its choice may hold
    later tokens (the `</think>` among them). Its reasoning tokens still get no text logprobs."""
    from types import SimpleNamespace

    from dsflash.gateway.generation import Choice, Update
    from dsflash.gateway.responses_api import ResponsesFormat
    from dsflash.gateway.schema import ResponsesRequest
    from dsflash.v1 import worker_pb2

    req = ResponsesRequest(input="hi", include=["message.output_text.logprobs"])
    spec = SimpleNamespace(prompt=[1, 2])
    fmt = ResponsesFormat(SimpleNamespace(tokenizer=tok, settings=None), spec, req, [])
    choice = Choice(0, detok=None, parser=None, starts_in_reasoning=True)
    thought, text = text_ids(tok, "hm"), text_ids(tok, "ok")
    choice.extend(thought, [])
    update = Update(choice, thought, "", {"reasoning_content": "hm"},
                    [worker_pb2.TokenLogprob(token_id=t, logprob=-1.0) for t in thought], done=False)
    choice.extend([st.THINK_END.id] + text, [])  # the relay went on
    events = fmt.stream_update(update)
    assert not any('"logprob"' in e for e in events)
    later = Update(choice, text, "ok", {"content": "ok"},
                   [worker_pb2.TokenLogprob(token_id=t, logprob=-1.0) for t in text], done=False)
    logged = [json.loads(e.split("data: ", 1)[1]) for e in fmt.stream_update(later)]
    assert [len(e["logprobs"]) for e in logged if e["type"] == "response.output_text.delta"] == [len(text)]


def test_a_forced_call_is_no_reasoning_and_stop_strings_hold(tok):
    """tool_choice forces a call: the prompt ends the (empty) reasoning, so the reply has no
    reasoning tokens, and a stop string is matched in it (chat and responses alike)."""
    calls = SegmentBuilder()
    render_calls(calls, [("get_weather", {"city": "Paris"})])
    full = spell(calls.build())
    rest = text_ids(tok, full[full.index('">\n') + 3:]) + [st.EOS.id]
    gw = ScriptedGateway(lambda r: (chunked(rest), "stop"))
    try:
        client = _client(gw)
        forced = client.responses.create(model="m", input="weather?", tools=[TOOL],
                                         tool_choice={"type": "function", "name": "get_weather"})
        assert [i.type for i in forced.output] == ["function_call"]
        assert json.loads(forced.output[0].arguments) == {"city": "Paris"}
        assert forced.usage.output_tokens_details.reasoning_tokens == 0
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "weather?"}],
                                              tools=[CHAT_TOOL], tool_choice="required", stop=["Paris"])
        assert chat.usage.completion_tokens < len(rest)  # the stop string held: the reply ended there
    finally:
        gw.close()


def test_a_client_hanging_up_on_a_whole_reply_cancels_the_worker(tok):
    """Not streamed, too: the hang-up reaches the endpoint (no middleware hides it), the worker
    stops, and the response is not stored."""
    import time

    word = text_ids(tok, "word ")
    gw = ScriptedGateway(lambda r: ([word] * 60 + [[st.EOS.id]], "stop"), delay_s=0.1)
    try:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/responses", {"input": "hi"})):
            before = len(gw.backend.cancelled)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{gw.url}{path}", json={"model": "m", **body}, timeout=0.8)
            for _ in range(60):
                if len(gw.backend.cancelled) > before:
                    break
                time.sleep(0.1)
            assert len(gw.backend.cancelled) == before + 1, path
        assert not gw.ctx.responses._records
    finally:
        gw.close()


def test_sealed_reasoning_comes_back_whole_from_a_stateless_client(tok):
    """store: false with include ["reasoning.encrypted_content"] (how agent CLIs run): the
    reasoning item carries its text sealed, and sent back with nothing else it renders the same
    prompt as the stored chain does."""
    ids = _call_reply(tok)
    gw = ScriptedGateway(lambda r: (chunked(ids), "stop"))
    try:
        client = _client(gw)
        first = client.responses.create(model="m", input="weather?", tools=[TOOL], store=False,
                                        include=["reasoning.encrypted_content"])
        reasoning, call = first.output
        assert reasoning.encrypted_content and call.type == "function_call"
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        stripped = {"type": "reasoning", "id": reasoning.id, "summary": [],
                    "encrypted_content": reasoning.encrypted_content}
        client.responses.create(model="m", input=[{"role": "user", "content": "weather?"}, stripped,
                                                  call.model_dump(exclude_unset=True), output], tools=[TOOL])
        stateless = list(gw.backend.requests[-1].token_ids)
        stored = client.responses.create(model="m", input="weather?", tools=[TOOL])
        client.responses.create(model="m", input=[output], tools=[TOOL], previous_response_id=stored.id)
        assert list(gw.backend.requests[-1].token_ids) == stateless
        assert "Need the weather." in tok.decode(stateless)
        events = _events(gw, {"model": "m", "input": "weather?", "tools": [TOOL],
                              "include": ["reasoning.encrypted_content"]})
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert done[0]["encrypted_content"] == reasoning.encrypted_content
    finally:
        gw.close()


def test_another_replica_quotes_the_reply_with_the_ids_the_worker_cached(tok, redis_server):
    """A sampled reply may re-tokenize to other ids than the model generated; the replica that
    made it quotes it with the generated ids (its ReplyMemory), and so does another replica
    continuing it through Redis (the replies' memory shared there), or the worker's cached turn
    would not match."""
    from dsflash.gateway.replies import ReplyMemory, SharedReplies

    spelled = text_ids(tok, "Hel") + text_ids(tok, "lo there")
    assert tok.decode(spelled) == "Hello there" and text_ids(tok, "Hello there") != spelled
    gateways = [ScriptedGateway(lambda r: ([spelled, [st.EOS.id]], "stop")) for _ in range(2)]
    for gw in gateways:
        gw.ctx.responses = RedisResponseStore.from_url(redis_server.url)
        gw.ctx.replies = ReplyMemory(shared=SharedReplies(redis_server.url))
    try:
        a, b = (_client(gw) for gw in gateways)
        off = {"thinking": {"type": "disabled"}}
        first = a.responses.create(model="m", input="one", extra_body=off)
        b.responses.create(model="m", input="two", previous_response_id=first.id, extra_body=off)
        prompt = list(gateways[1].backend.requests[-1].token_ids)
        assert any(prompt[i:i + len(spelled)] == spelled for i in range(len(prompt)))
    finally:
        for gw in gateways:
            gw.close()


def test_chat_turns_on_another_replica_quote_the_reply_as_generated(tok, redis_server):
    """Chat completions keep no stored response: the gateways share their reply memories
    through Redis, so turn two on another replica still quotes turn one's reply with its
    generated ids. Without Redis it does not (the control). A Redis that stops answering is
    asked once, then skipped: the turn is served, re-tokenized."""
    from dsflash.gateway.replies import ReplyMemory, SharedReplies

    spelled = text_ids(tok, "Hel") + text_ids(tok, "lo there")
    history = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Hello there"},
               {"role": "user", "content": "two"}]
    off = {"thinking": {"type": "disabled"}}

    def turns(gateways) -> list[int]:
        a, b = (_client(gw) for gw in gateways)
        a.chat.completions.create(model="m", messages=history[:1], extra_body=off)
        b.chat.completions.create(model="m", messages=history, extra_body=off)
        return list(gateways[1].backend.requests[-1].token_ids)

    def quoted(prompt) -> bool:
        return any(prompt[i:i + len(spelled)] == spelled for i in range(len(prompt)))

    for shared in (True, False):
        gateways = [ScriptedGateway(lambda r: ([spelled, [st.EOS.id]], "stop")) for _ in range(2)]
        if shared:
            for gw in gateways:
                gw.ctx.replies = ReplyMemory(shared=SharedReplies(redis_server.url))
        try:
            assert quoted(turns(gateways)) == shared
        finally:
            for gw in gateways:
                gw.close()
    gateways = [ScriptedGateway(lambda r: ([spelled, [st.EOS.id]], "stop")) for _ in range(2)]
    reads = []
    for gw in gateways:
        gw.ctx.replies = ReplyMemory(shared=SharedReplies(redis_server.url))
        reader = gw.ctx.replies.shared._reader  # (counts what reaches Redis)
        reader.get = lambda name, get=reader.get: reads.append(name) or get(name)
    history += [{"role": "assistant", "content": "Another reply"}, {"role": "user", "content": "three"}]
    redis_server.pause()
    try:
        assert not quoted(turns(gateways))
        assert len(reads) == 1  # two replies to look up: the failed read switched Redis off for the second
    finally:
        redis_server.resume()
        for gw in gateways:
            gw.close()
