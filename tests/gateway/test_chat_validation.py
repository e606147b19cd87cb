"""Requests the encoder refuses: a ChatEncodingError naming the field, shaped for an OpenAI 400."""

from __future__ import annotations

import pytest

from dsflash.gateway.chat_encoding import encode_chat, render_chat
from dsflash.gateway.chat_errors import ChatEncodingError

OK_USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}


def refused(param: str, **request) -> ChatEncodingError:
    request.setdefault("messages", [OK_USER])
    with pytest.raises(ChatEncodingError) as info:
        render_chat(request.pop("messages"), **request)
    assert info.value.param == param
    return info.value


def test_image_part_is_refused_with_an_openai_error_object():
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    error = refused("messages[1].content[1].type",
                    messages=[OK_USER, {"role": "user", "content": [{"type": "text", "text": "see"}, image]}])
    assert error.to_openai() == {"error": {
        "message": "messages[1].content[1]: content part type 'image_url' is not supported; this model accepts "
                   "text only",
        "type": "invalid_request_error", "param": "messages[1].content[1].type", "code": "unsupported_content_type"}}


@pytest.mark.parametrize("part_type", ["input_audio", "file", "image", "video_url", None])
def test_other_non_text_parts_are_refused(part_type):
    refused("messages[0].content[0].type", messages=[{"role": "user", "content": [{"type": part_type}]}])


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ("hi", "messages"),
    (["hi"], "messages[0]"),
    ([{"role": "function", "content": "x", "name": "f"}], "messages[0].role"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text"),
    ([OK_USER, {"role": "tool", "content": "r"}], "messages[1].tool_call_id"),
    ([OK_USER, {"role": "assistant", "content": None, "reasoning_content": 3}], "messages[1].reasoning_content"),
    ([OK_USER, {"role": "assistant", "content": "", "tool_calls": {"id": "x"}}], "messages[1].tool_calls"),
    ([OK_USER, {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}], "messages[1].tool_calls[0]"),
    ([OK_USER, {"role": "assistant", "tool_calls": [{"function": {"name": ""}}]}],
     "messages[1].tool_calls[0].function.name"),
    ([OK_USER, {"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f"}}]}],
     "messages[1].tool_calls[0].id"),
])
def test_malformed_messages(messages, param):
    refused(param, messages=messages)


@pytest.mark.parametrize("value", ["minimal", "xhigh", "HIGH", 0, 101, 50.0, True, "80", [75]])
def test_bad_reasoning_effort(value):
    error = refused("reasoning_effort", reasoning_effort=value)
    assert "low, medium, high, max, none" in error.message


def test_bad_reasoning_effort_is_refused_in_chat_mode_too():
    refused("reasoning_effort", reasoning_effort="ultra", thinking=False)


@pytest.mark.parametrize("tools, param", [
    ({"type": "function"}, "tools"),
    ([{"type": "custom", "name": "x"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
])
def test_bad_tools(tools, param):
    refused(param, tools=tools)


@pytest.mark.parametrize("tools, choice", [
    ([TOOL], {"type": "function", "function": {"name": "g"}}),
    ([TOOL], {"type": "function", "function": "f"}),
    ([TOOL], "sometimes"),
    (None, "required"),
])
def test_bad_tool_choice(tools, choice):
    refused("tool_choice", tools=tools, tool_choice=choice)


@pytest.mark.parametrize("response_format, param", [
    ({"type": "xml"}, "response_format.type"),
    ("json", "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
])
def test_bad_response_format(response_format, param):
    refused(param, response_format=response_format)


def test_lone_surrogate_becomes_a_request_error(tokenizer):
    with pytest.raises(ChatEncodingError) as info:
        encode_chat(tokenizer, [{"role": "user", "content": "bad \ud800"}])
    assert info.value.param == "messages"
