"""Output parser: reasoning vs content, DSML tool calls as streamed OpenAI deltas, graceful failure."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from dsflash.gateway.dsml import render_calls
from dsflash.gateway.output_parser import OutputParser, parse_completion
from dsflash.gateway.segments import SegmentBuilder, spell

D = "｜DSML｜"


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def calls_markup(calls: list[tuple[str, dict]]) -> str:
    out = SegmentBuilder()
    render_calls(out, calls)
    return spell(out.build())


def stream(text: str, cuts: list[int], **options):
    """Feed `text` cut at `cuts`; return the deltas and the finished message."""
    parser = OutputParser(new_call_id=ids(), **options)
    bounds = [0, *cuts, len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    last, message = parser.finish()
    return [*deltas, last], message


def assert_same_everywhere(text: str, **options):
    """Whole-text parse == streamed parse for every two-piece cut and for one char at a time."""
    whole = parse_completion(text, new_call_id=ids(), **options)
    for cut in range(len(text) + 1):
        assert stream(text, [cut], **options)[1] == whole, cut
    deltas, message = stream(text, list(range(1, len(text))), **options)
    assert message == whole
    # The deltas add up to the message.
    assert "".join(d.content for d in deltas) == whole.content
    assert "".join(d.reasoning_content for d in deltas) == whole.reasoning_content
    for k, call in enumerate(whole.tool_calls):
        assert "".join(c.arguments for d in deltas for c in d.tool_calls if c.index == k) == call.arguments
    return whole


# ---- reasoning and content ------------------------------------------------------------------

def test_thinking_output_splits_at_think_end():
    message = assert_same_everywhere("Let me see: 1<2 and </thin is not it.</think>Answer: 4.", starts_in_reasoning=True)
    assert (message.reasoning_content, message.content) == ("Let me see: 1<2 and </thin is not it.", "Answer: 4.")
    assert message.tool_calls == [] and not message.has_tool_calls


def test_chat_output_is_all_content_and_missing_think_end_is_all_reasoning():
    assert parse_completion("plain </think> text", starts_in_reasoning=False).content == "plain </think> text"
    cut_off = parse_completion("still thinking <", starts_in_reasoning=True)
    assert (cut_off.reasoning_content, cut_off.content) == ("still thinking <", "")


def test_text_after_eos_is_ignored():
    message = parse_completion("r</think>c<｜end▁of▁sentence｜>junk", starts_in_reasoning=True)
    assert (message.reasoning_content, message.content) == ("r", "c")


# ---- tool calls -----------------------------------------------------------------------------

CALLS = [
    ("get_weather", {"city": "Zürich", "unit": "c"}),
    ("search", {"query": 'café "best" <b> \\ \n line2', "filters": {"tags": ["a", "b"], "max": 3},
                "n": 5, "ok": True, "none": None, "num_text": "5"}),
    ("ns::noop", {}),
]


def test_dsml_render_then_parse_round_trip():
    text = "I should call the tools.</think>Checking both." + calls_markup(CALLS)
    message = assert_same_everywhere(text, starts_in_reasoning=True)
    assert message.reasoning_content == "I should call the tools."
    assert message.content == "Checking both."  # the blank line before the block is markup
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == CALLS
    assert [c.id for c in message.tool_calls] == ["call_0", "call_1", "call_2"]
    # Arguments are written as the official decoder writes them.
    assert message.tool_calls[0].arguments == '{"city": "Zürich", "unit": "c"}'
    assert message.has_tool_calls


def test_official_v41_example_output():
    # Sub-format E as rendered by the official encoding.py (store id 70989314921).
    text = ("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
            "<｜DSML｜ parameter name=\"city\" string=\"true\">Zürich</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"unit\" string=\"true\">c</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
            "<｜DSML｜ invoke name=\"search\">\n<｜DSML｜ parameter name=\"query\" string=\"true\">café \"best\"</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"filters\" string=\"false\">{\"tags\": [\"a\", \"b\"], \"max\": 3}</｜DSML｜ parameter>\n"
            "</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>")
    message = parse_completion("I should call the tools.</think>" + text, starts_in_reasoning=True, new_call_id=ids())
    assert message.to_openai() == {
        "role": "assistant", "content": None, "reasoning_content": "I should call the tools.",
        "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "c"}'}},
            {"id": "call_1", "type": "function",
             "function": {"name": "search", "arguments": '{"query": "café \\"best\\"", '
                                                         '"filters": {"tags": ["a", "b"], "max": 3}}'}}]}


def test_streamed_deltas_have_the_openai_shape():
    text = "ok" + calls_markup(CALLS[:2])
    deltas, _ = stream(text, list(range(1, len(text))), starts_in_reasoning=False)
    chunks = [d.to_openai() for d in deltas if d]
    calls = [c for chunk in chunks for c in chunk.get("tool_calls", [])]
    assert calls[0] == {"index": 0, "id": "call_0", "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}}
    firsts = [c for c in calls if "id" in c]
    assert [(c["index"], c["function"]["name"]) for c in firsts] == [(0, "get_weather"), (1, "search")]
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
               for c in calls if "id" not in c)
    # A string value streams as it is generated, not only at its closing tag.
    query_pieces = [c["function"]["arguments"] for c in calls if c["index"] == 1 and "id" not in c]
    assert len(query_pieces) > 10
    assert chunks[0] == {"content": "o"}


def test_several_pieces_of_one_feed_merge_into_one_delta():
    delta = OutputParser(starts_in_reasoning=False, new_call_id=ids()).feed("x" + calls_markup(CALLS[:1]))
    assert delta.to_openai() == {"content": "x", "tool_calls": [
        {"index": 0, "id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "c"}'}}]}


@pytest.mark.parametrize("attrs, raw, value", [
    ('string="true"', "5", "5"),
    ('string="false"', "5", 5),
    ('string="false"', " [1, {\"a\": null}]\n", [1, {"a": None}]),
    ('string="false"', "not json", "not json"),
    ('string="false"', "NaN", "NaN"),
    ('', "true", True),
    ('', "plain words", "plain words"),
])
def test_parameter_typing(attrs, raw, value):
    header = f'<{D} parameter name="p"' + (f" {attrs}" if attrs else "") + ">"
    text = f'\n\n<{D} calls>\n<{D} invoke name="f">\n{header}{raw}</{D} parameter>\n</{D} invoke>\n</{D} calls>'
    message = assert_same_everywhere(text, starts_in_reasoning=False)
    assert json.loads(message.tool_calls[0].arguments) == {"p": value}


def test_text_after_the_block_and_a_second_block_are_parsed():
    text = "a" + calls_markup(CALLS[:1]) + " b" + calls_markup(CALLS[2:])
    message = assert_same_everywhere(text, starts_in_reasoning=False)
    assert message.content == "a b"
    assert [c.name for c in message.tool_calls] == ["get_weather", "ns::noop"]


def test_one_call_kept_where_parallel_calls_are_off():
    """max_calls=1 (parallel_tool_calls: false): the first call streams and ends the message's
    calls; the second neither streams nor stays, in one block or in the next."""
    one_block, two_blocks = calls_markup(CALLS[:2]), calls_markup(CALLS[:1]) + " b" + calls_markup(CALLS[2:])
    for text in ("ok" + one_block, "ok" + two_blocks):
        message = assert_same_everywhere(text, starts_in_reasoning=False, max_calls=1)
        assert [c.name for c in message.tool_calls] == ["get_weather"]
        deltas, _ = stream(text, list(range(1, len(text))), starts_in_reasoning=False, max_calls=1)
        assert {piece.index for d in deltas for piece in d.tool_calls} == {0}


def test_tools_disabled_and_markup_in_reasoning_stay_text():
    text = "x" + calls_markup(CALLS[:1])
    assert parse_completion(text, starts_in_reasoning=False, tools_enabled=False).content == text
    in_reasoning = parse_completion(text + "</think>done", starts_in_reasoning=True)
    assert (in_reasoning.reasoning_content, in_reasoning.content, in_reasoning.tool_calls) == (text, "done", [])


# ---- malformed markup -----------------------------------------------------------------------

@pytest.mark.parametrize("broken", [
    f"\n\n<{D} calls>\nI will now call a tool",  # prose instead of an invoke
    f"\n\n<{D} calls>\n<{D} invoke name=\"\">\n</{D} invoke>\n</{D} calls>",  # empty name
    f"\n\n<{D} calls>\n<{D} invoke name=\"f\nmore\">",  # name across lines
    f"\n\n<{D} calls>\n<{D} invoke",  # cut off
    f"<{D} calls><{D} tool_calls>",  # unknown tag
])
def test_a_block_that_streamed_nothing_becomes_content(broken):
    message = assert_same_everywhere("Intro." + broken, starts_in_reasoning=False)
    assert (message.content, message.tool_calls) == ("Intro." + broken, [])


def test_broken_markup_after_a_streamed_call_closes_it_and_the_rest_is_content():
    text = (f'\n\n<{D} calls>\n<{D} invoke name="f">\n<{D} parameter name="a" string="true">x</{D} parameter>\n'
            f'<{D} parameter name="b" string="maybe">y</{D} parameter>\n</{D} invoke>\n</{D} calls>')
    message = assert_same_everywhere(text, starts_in_reasoning=False)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("f", '{"a": "x"}')]
    assert message.content.startswith(f'<{D} parameter name="b" string="maybe">y')


def test_generation_cut_inside_a_call_keeps_valid_json():
    head = f'\n\n<{D} calls>\n<{D} invoke name="f">\n<{D} parameter name="n" string="false">1</{D} parameter>\n'
    cases = {
        head + f'<{D} parameter name="s" string="true">partial val': {"n": 1, "s": "partial val"},
        head + f'<{D} parameter name="j" string="false">[1, 2': {"n": 1},
        head + f'</{D} inv': {"n": 1},
        f'\n\n<{D} calls>\n<{D} invoke name="g">\n<{D} parameter name="s" string="true">a</{D} par': {"s": "a</｜DSML｜ par"},
    }
    for text, arguments in cases.items():
        message = assert_same_everywhere(text, starts_in_reasoning=False)
        assert (message.content, json.loads(message.tool_calls[0].arguments)) == ("", arguments)


def test_random_damage_never_raises_and_arguments_stay_json():
    rng = random.Random(11)
    good = "r</think>c" + calls_markup(CALLS)
    for _ in range(300):
        text = list(good)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(text))
            action = rng.randrange(3)
            if action == 0:
                del text[at:at + rng.randrange(1, 12)]
            elif action == 1:
                text.insert(at, rng.choice(["<", ">", "\"", "\n", D, "</think>", "x", f"</{D} calls>"]))
            else:
                text = text[:at]
        damaged = "".join(text)
        cuts = sorted(rng.sample(range(len(damaged) + 1), min(5, len(damaged) + 1)))
        _, message = stream(damaged, cuts, starts_in_reasoning=True)
        assert message == parse_completion(damaged, starts_in_reasoning=True, new_call_id=ids())
        for call in message.tool_calls:
            json.loads(call.arguments)
