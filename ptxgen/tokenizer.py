"""The tokenizer a GGUF file carries (its tokenizer.ggml.* metadata), read as llama.cpp reads it:
text to token ids and back, for `ptxgen generate --prompt`.

Byte-level BPE (tokenizer.ggml.model "gpt2": Qwen2/3 and Llama 3 files) with the "qwen2" and
"llama-bpe" pre-tokenizers. Encoding:
1. special tokens (types CONTROL, USER_DEFINED, UNKNOWN) are cut out of the text wherever they
   occur literally, the longest first (llama.cpp's tokenize with parse_special);
2. the pre-tokenizer's regex splits each other piece into words (Qwen2 takes digits one by one,
   Llama 3 up to three at a time);
3. a word, as GPT-2's byte-to-character alphabet of its UTF-8 bytes, is merged pair by pair, the
   pair of the lowest merge rank first (the leftmost of equals); Llama 3 takes a word that is a
   token as it is (llama.cpp's ignore_merges);
4. the BOS token comes first where tokenizer.ggml.add_bos_token says so (absent: Llama 3 yes,
   Qwen2 no).
Decoding maps NORMAL tokens back to their bytes and renders CONTROL, USER_DEFINED and UNKNOWN
tokens as their text (other types as nothing), then reads the bytes as UTF-8, bytes that are not
valid UTF-8 (a sequence cut short) as U+FFFD. llama.cpp's clean_spaces is not applied: only its
whole-text detokenize does that, its streamed output is the byte-level pieces, as here.

Any other tokenizer (SentencePiece "llama", another pre-tokenizer) is refused when text is needed;
token ids work for any file, and so do the end-of-generation ids.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import regex

from .errors import PtxgenError

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)
# Generation ends at the ids these keys name and at tokens of these texts (llama.cpp's eog set).
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
END_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
                       "<|end_of_text|>"})


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others for
    code points from 256 up, in byte order."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


BYTE_CHARS = _byte_chars()
CHAR_BYTES = {char: byte for byte, char in enumerate(BYTE_CHARS)}


def _split_pattern(digits: str) -> str:
    """The Qwen2 / Llama 3 split regex (tokenizer.json's, with llama.cpp's explicit cases for its
    (?i:) contractions) with `digits` for numbers."""
    return (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits
            + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    pattern: str
    ignore_merges: bool = False  # a word that is a token whole is that token
    add_bos: bool = False  # without tokenizer.ggml.add_bos_token


QWEN2 = PreTokenizer(_split_pattern(r"\p{N}"))
LLAMA3 = PreTokenizer(_split_pattern(r"\p{N}{1,3}"), ignore_merges=True, add_bos=True)
# tokenizer.ggml.pre values, with llama.cpp's aliases
PRE_TOKENIZERS = {"qwen2": QWEN2, "deepseek-r1-qwen": QWEN2, "llama-bpe": LLAMA3, "llama3": LLAMA3, "llama-v3": LLAMA3}


class Tokenizer:
    """A GGUF model's tokenizer; `end_of_generation`: the ids greedy decoding stops at."""

    def __init__(self, model):
        self.path, self._metadata = model.path, model.metadata
        # Read leniently here (token ids work whatever the tokenizer holds); text checks them (_key).
        tokens = model.metadata("tokenizer.ggml.tokens", [])
        self.tokens: list[str] = tokens if _is_list_of(tokens, str) else []
        types = model.metadata("tokenizer.ggml.token_type", None)
        self.types: list[int] = types if _is_list_of(types, int) else [NORMAL] * len(self.tokens)
        named = {model.metadata(key, None) for key in END_KEYS}
        self.end_of_generation = frozenset(
            {token for token in named if _is_list_of([token], int) and 0 <= token < len(self.tokens)}
            | {token for token, text in enumerate(self.tokens) if text in END_TEXTS})

    def _key(self, name: str, kind: type, listed: bool = False, default=None):
        """tokenizer.ggml.`name`: a `kind` (a list of them if `listed`), else one error naming the
        key; `default` where it is absent (None: required)."""
        key = f"tokenizer.ggml.{name}"
        value = self._metadata(key) if default is None else self._metadata(key, default)
        if not _is_list_of(value if listed else [value], kind):
            wanted = f"a list of {kind.__name__}s" if listed else kind.__name__
            raise PtxgenError(f"{self.path}: {key} must be {wanted}, got {type(value).__name__}")
        return value

    def _check_byte_level(self) -> None:
        model = self._key("model", str)
        if model != "gpt2":
            raise PtxgenError(f"{self.path}: tokenizer.ggml.model = {model!r}: ptxgen turns text into tokens and back "
                              "only for byte-level BPE ('gpt2', as Qwen2/3 and Llama 3 files); give token ids with "
                              "--tokens")
        self._key("tokens", str, listed=True)
        if len(self._key("token_type", int, listed=True, default=self.types)) != len(self.tokens):
            raise PtxgenError(f"{self.path}: tokenizer.ggml.token_type has {len(self.types)} entries for "
                              f"{len(self.tokens)} tokens")

    def undecodable(self, vocab_size: int) -> str | None:
        """Why decode cannot give the text of every id a model of `vocab_size` outputs (None: it can)."""
        try:
            self._check_byte_level()
        except PtxgenError as error:
            return str(error)
        if vocab_size > len(self.tokens):
            return (f"{self.path}: the model outputs {vocab_size} token ids, its tokenizer (tokenizer.ggml.tokens) "
                    f"names {len(self.tokens)}")
        return None

    @functools.cached_property
    def _encoder(self):
        """What encode needs: (pre-tokenizer, compiled split regex, merge ranks, token ids by text,
        special tokens longest first, add BOS)."""
        self._check_byte_level()
        pre = self._key("pre", str)
        if pre not in PRE_TOKENIZERS:
            raise PtxgenError(f"{self.path}: tokenizer.ggml.pre = {pre!r}: not a pre-tokenizer ptxgen knows "
                              f"({', '.join(PRE_TOKENIZERS)}); give token ids with --tokens")
        settings = PRE_TOKENIZERS[pre]
        ranks = {}
        for rank, merge in enumerate(self._key("merges", str, listed=True)):
            ranks.setdefault(tuple(merge.split(" ", 1)), rank)  # listed twice: its first rank, as llama.cpp
        ids = {text: token for token, text in enumerate(self.tokens)}
        specials = sorted((token for token, kind in enumerate(self.types)
                           if kind in SPECIAL_TYPES and self.tokens[token]),
                          key=lambda token: (-len(self.tokens[token]), token))
        add_bos = self._key("add_bos_token", bool, default=settings.add_bos)
        if add_bos and self._metadata("tokenizer.ggml.bos_token_id", None) is None:
            raise PtxgenError(f"{self.path}: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id "
                              "is not set")
        return settings, regex.compile(settings.pattern), ranks, ids, specials, add_bos

    @property
    def adds_bos(self) -> bool:
        """Whether encode puts the BOS token first (the file's add_bos_token, else the pre-tokenizer's)."""
        return self._encoder[-1]

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, special tokens' texts matched literally, BOS first where the
        file asks for it."""
        settings, split, ranks, ids, specials, add_bos = self._encoder
        pieces: list[str | int] = [text]  # text still to split, or a special token's id
        for token in specials:
            special = self.tokens[token]
            cut = []
            for piece in pieces:
                if isinstance(piece, str) and special in piece:
                    for i, part in enumerate(piece.split(special)):
                        cut += ([token] if i else []) + ([part] if part else [])
                else:
                    cut.append(piece)
            pieces = cut
        result = [self._key("bos_token_id", int)] if add_bos else []
        for piece in pieces:
            if isinstance(piece, int):
                result.append(piece)
                continue
            for word in split.findall(piece):
                result += self._merge(word, settings.ignore_merges, ranks, ids)
        return result

    def _merge(self, word: str, ignore_merges: bool, ranks: dict, ids: dict) -> list[int]:
        """A word's tokens: its bytes' characters merged by rank."""
        # Command-line text carries bytes that are not UTF-8 as surrogate escapes: they are
        # encoded as the bytes they were.
        try:
            chars = "".join(BYTE_CHARS[b] for b in word.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError as error:
            char = word[error.start]
            raise PtxgenError(f"text: {char!r} (U+{ord(char):04X}, a lone surrogate) is not encodable as "
                              "UTF-8") from None
        if ignore_merges and chars in ids:
            return [ids[chars]]
        parts = merged(chars, ranks)
        missing = [part for part in parts if part not in ids]
        if missing:
            raise PtxgenError(f"{self.path}: the tokenizer has no token {missing[0]!r} (a merge's result or a byte "
                              "token is missing from tokenizer.ggml.tokens)")
        return [ids[part] for part in parts]

    def decode(self, ids: list[int]) -> str:
        """The text of token ids: NORMAL tokens' bytes, special tokens' text, as UTF-8 (U+FFFD for
        bytes that are not)."""
        self._check_byte_level()
        data = bytearray()
        for token in ids:
            if not 0 <= token < len(self.tokens):
                raise PtxgenError(f"{self.path}: token {token} is not one of the tokenizer's {len(self.tokens)}")
            text, kind = self.tokens[token], self.types[token]
            if kind in SPECIAL_TYPES:
                data += text.encode()
            elif kind == NORMAL:
                # A character outside the byte alphabet: the token's own UTF-8, as Hugging Face's
                # ByteLevel decoder reads it.
                data += bytes(CHAR_BYTES[c] for c in text) if all(c in CHAR_BYTES for c in text) else text.encode()
        return data.decode("utf-8", errors="replace")


def merged(chars: str, ranks: dict) -> list[str]:
    """BPE: the pair of the lowest merge rank merged first, the leftmost of equals, until no pair
    has a rank. A heap of candidate pairs (rank, where the left part starts), each checked when it
    comes up, against a linked list of the parts: n log n in the word's length, where rescanning
    the pairs after each merge took n^2 (2 s for a run of 4000 spaces)."""
    parts: list[str | None] = list(chars)  # parts[i]: the part that starts at character i (None: inside one)
    after = list(range(1, len(parts) + 1))  # where the next part starts
    before = list(range(-1, len(parts) - 1))
    heap = [(ranks[pair], i) for i, pair in enumerate(zip(parts, parts[1:])) if pair in ranks]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = after[i]
        if parts[i] is None or j >= len(parts) or ranks.get((parts[i], parts[j])) != rank:
            continue  # merged since: a rank names one pair, so an equal rank is that pair still
        parts[i], parts[j] = parts[i] + parts[j], None
        after[i] = after[j]
        if after[i] < len(parts):
            before[after[i]] = i
        for left in (before[i], i):
            right = after[left] if left >= 0 else len(parts)
            if right < len(parts) and (parts[left], parts[right]) in ranks:
                heapq.heappush(heap, (ranks[parts[left], parts[right]], left))
    return [part for part in parts if part is not None]


def _is_list_of(values, kind: type) -> bool:
    """A list whose items are all `kind`s (a bool is no int here)."""
    return isinstance(values, list) and all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
                                            for v in values)
