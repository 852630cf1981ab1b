"""ptxgen.tokenizer on the tiny fixtures' byte-level BPE vocabularies (tests/fixtures/make_tiny_gguf.py:
merges learned from a fixed text, Qwen3's and Llama 3's special tokens): round trips, the
pre-tokenizers' known pitfalls, and agreement with Hugging Face `tokenizers` built from the same
vocabulary, merges and tokenizer.json's own split regexes (written here as the model repositories
ship them, with (?i:) contractions, not copied from ptxgen)."""

from __future__ import annotations

import gguf
import pytest
import regex
from fixtures.make_tiny_gguf import ARCH, rewrite_gguf, write_tiny_gguf
from hypothesis import HealthCheck, given, settings, strategies as st

from ptxgen.errors import PtxgenError
from ptxgen.gguf_model import GGUFModel
from ptxgen.tokenizer import BYTE_CHARS, CONTROL, NORMAL, PRE_TOKENIZERS, Tokenizer, merged

# tokenizer.json's pre_tokenizer Split patterns: Qwen2/Qwen3 and Llama 3.
HF_PATTERNS = {
    "qwen3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
    "llama": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
}
SPECIALS = {arch: [text for text, _ in ARCH[arch]["specials"]] for arch in ARCH}
# Pieces that meet the pitfalls: contractions in any case, digit runs, space and newline runs,
# multi-byte characters, emoji (4 bytes, one of them a merged token), the special tokens.
PIECES = ["'s", "'S", "'ll", "'LL", "'Re", "'ve", "'d", "'m", "'t", "'x", "don't", "I'M", " ", "  ", "   ", "\n", "\n\n",
          "\r\n", "\t", " \n ", "1", "12", "123", "1234", "12345", "3.14", "2026-11-30", "é", "ü", "中文", "😀", "🚀✨",
          "the", " the", "The", "Hello", " world", "\u00a0", "\u3000", "\u200b", "\x00", "<|", "|>", "<think", "think>",
          *SPECIALS["qwen3"], *SPECIALS["llama"]]


def text_of(alphabet):
    return st.text(alphabet, max_size=40) | st.lists(st.sampled_from(PIECES) | st.text(alphabet, max_size=4),
                                                     max_size=12).map("".join)


texts = text_of(st.characters(exclude_categories=("Cs",)))
# For the comparison with tokenizers: characters assigned in Python's own Unicode tables (14.0 on
# 3.11). Engines of other Unicode versions class newer ones differently: U+3D000 is a letter to
# regex 2026.11, unassigned to tokenizers 0.23's Oniguruma, so its pieces differ. And no long s:
# tokenizer.json's (?i:'s) takes "'ſ" as a contraction, llama.cpp's explicit '[sS] does not
# (test_pre_tokenizer_splits).
assigned_texts = text_of(st.characters(exclude_categories=("Cs", "Cn"), exclude_characters="ſ"))
examples = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer")
    return {arch: GGUFModel(write_tiny_gguf(root / f"{arch}.gguf", arch, quant="q4_k")) for arch in ARCH}


@pytest.fixture(scope="module")
def tokenizers(models):
    return {arch: Tokenizer(model) for arch, model in models.items()}


def bos(tokenizer: Tokenizer, arch: str) -> list[int]:
    """The ids encode puts first: Llama 3's BOS (add_bos_token true), nothing for Qwen3."""
    return [tokenizer.tokens.index(SPECIALS["llama"][0])] if arch == "llama" else []


# --- round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCH))
@examples
@given(text=texts)
def test_decode_inverts_encode(tokenizers, arch, text):
    tokenizer = tokenizers[arch]
    ids = tokenizer.encode(text)
    assert ids[:len(bos(tokenizer, arch))] == bos(tokenizer, arch), "BOS first where the file asks for it"
    assert tokenizer.decode(ids[len(bos(tokenizer, arch)):]) == text


@pytest.mark.parametrize("arch", list(ARCH))
def test_special_tokens_are_matched_literally_and_decoded_as_their_text(tokenizers, arch):
    tokenizer = tokenizers[arch]
    specials = SPECIALS[arch]
    ids = tokenizer.encode(f"a{specials[1]}{specials[0]} b{specials[-1]}")
    special_ids = [tokenizer.tokens.index(text) for text in specials]
    body = ids[len(bos(tokenizer, arch)):]
    assert [t for t in body if t in special_ids] == [special_ids[1], special_ids[0], special_ids[-1]], body
    assert tokenizer.decode(body) == f"a{specials[1]}{specials[0]} b{specials[-1]}"
    # Another architecture's special text is plain text here: BPE pieces, none of them special.
    other = SPECIALS["llama" if arch == "qwen3" else "qwen3"][1]
    assert not set(tokenizer.encode(other)) & set(special_ids[len(bos(tokenizer, arch)):])


def test_user_defined_tokens_are_special_too(tokenizers):
    """Qwen3's <think> is USER_DEFINED: llama.cpp matches it in text like a CONTROL token."""
    tokenizer = tokenizers["qwen3"]
    think = tokenizer.tokens.index("<think>")
    assert tokenizer.types[think] != CONTROL
    assert tokenizer.encode("<think>") == [think]


def test_a_partial_utf8_sequence_decodes_as_replacement_characters(tokenizers):
    tokenizer = tokenizers["qwen3"]
    ids = tokenizer.encode("🎉")  # not in the training text: its 4 bytes are more than one token
    assert len(ids) >= 2, [tokenizer.tokens[t] for t in ids]
    assert tokenizer.decode(ids[:-1]) == "\ufffd" and tokenizer.decode(ids[-1:]) == "\ufffd"
    assert tokenizer.decode(ids) == "🎉"


def test_bytes_that_are_not_utf8_round_trip_as_surrogate_escapes(tokenizers):
    """Command-line text carries them so (Python's argv): each is its own byte token."""
    tokenizer = tokenizers["qwen3"]
    ids = tokenizer.encode("a\udcff")
    assert tokenizer.tokens[ids[-1]] == "ÿ" and tokenizer.decode(ids) == "a\ufffd"
    with pytest.raises(PtxgenError, match=r"U\+D800, a lone surrogate"):
        tokenizer.encode("\ud800")


# --- the pre-tokenizers' pitfalls -----------------------------------------------------------------------
@pytest.mark.parametrize("text, qwen2, llama3", [
    ("abc 12345", ["abc", " ", "1", "2", "3", "4", "5"], ["abc", " ", "123", "45"]),  # \p{N} vs \p{N}{1,3}
    ("  hello", [" ", " hello"], [" ", " hello"]),  # the run's last space goes with the word
    ("a\n\n b", ["a", "\n\n", " b"], ["a", "\n\n", " b"]),
    ("x \n\n", ["x", " \n\n"], ["x", " \n\n"]),
    # contractions in any case cut the letters after them off; another quote does not
    ("DON'TSTOP we'Llgo 'x", ["DON", "'T", "STOP", " we", "'Ll", "go", " '", "x"],
     ["DON", "'T", "STOP", " we", "'Ll", "go", " '", "x"]),
    ("I'm it'sx", ["I", "'m", " it", "'s", "x"], ["I", "'m", " it", "'s", "x"]),
    ("end.  ", ["end", ".", "  "], ["end", ".", "  "]),
    ("a'ſx", ["a", "'ſx"], ["a", "'ſx"]),  # llama.cpp's '[sS]: the long s folds to s only under (?i:)
    ("٣٤٥ 6", ["٣", "٤", "٥", " ", "6"], ["٣٤٥", " ", "6"]),  # Arabic-Indic digits are \p{N}
])
def test_pre_tokenizer_splits(text, qwen2, llama3):
    assert regex.findall(PRE_TOKENIZERS["qwen2"].pattern, text) == qwen2
    assert regex.findall(PRE_TOKENIZERS["llama-bpe"].pattern, text) == llama3


class ToyModel:
    """A stand-in for GGUFModel (what Tokenizer reads: path and metadata): the byte tokens, then
    "bc", "ab", "abc" from the merges "b c", "a b", "ab c", then CONTROL tokens `specials`."""

    path = "toy.gguf"

    def __init__(self, pre: str = "qwen2", specials: tuple[str, ...] = ()):
        tokens = [*BYTE_CHARS, "bc", "ab", "abc", *specials]
        self.fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
                       "tokenizer.ggml.token_type": [NORMAL] * 259 + [CONTROL] * len(specials),
                       "tokenizer.ggml.merges": ["b c", "a b", "ab c"], "tokenizer.ggml.add_bos_token": False}

    def metadata(self, key, *default):
        return self.fields.get(key, *default) if default else self.fields[key]


def rescanned(chars: str, ranks: dict) -> list[str]:
    """BPE as its definition reads: rescan every pair, merge the lowest rank's leftmost, again."""
    parts = list(chars)
    while len(parts) > 1:
        rank, i = min((ranks.get(pair, len(ranks)), i) for i, pair in enumerate(zip(parts, parts[1:])))
        if rank == len(ranks):
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


@settings(max_examples=300, deadline=None)
@given(word=st.text("abc", max_size=30), merges=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "ab", "ba", "aa",
                                                                                    "abc", "cab", "bb"]),
                                                                   st.sampled_from(["a", "b", "c", "ab", "bc", "aa"])),
                                                         unique=True, max_size=12))
def test_the_heap_merges_as_rescanning_does(word, merges):
    """merged's heap of candidate pairs gives what rescanning all pairs after each merge gives,
    repeated letters (overlapping pairs) and merges whose results make new pairs included."""
    ranks = {pair: rank for rank, pair in enumerate(merges)}
    assert merged(word, ranks) == rescanned(word, ranks)


@pytest.mark.parametrize("pre, ids", [("qwen2", [97, 256]), ("llama-bpe", [258])])
def test_llama3_takes_a_word_that_is_a_token_whole(pre, ids):
    """"abc" merges to a + bc ("b c" ranks first), though "abc" is a token: Llama 3 takes the
    token (llama.cpp's and tokenizers' ignore_merges), Qwen2 the merges."""
    assert Tokenizer(ToyModel(pre)).encode("abc") == ids


def test_the_longest_special_token_is_matched_first():
    """llama.cpp cuts the text at each special token, longest first: "<x><y>" before "<x>",
    wherever the shorter one starts."""
    tokenizer = Tokenizer(ToyModel(specials=("<x>", "<x><y>", "x><y")))
    assert tokenizer.encode("a<x><y><x>") == [97, 260, 259]
    assert tokenizer.encode("<x><y") == [60, 261], "x><y, though <x> starts first"


# --- an independent reference: Hugging Face tokenizers ----------------------------------------------------
def hugging_face(model: GGUFModel, arch: str):
    """`tokenizers` built as the model's tokenizer.json builds it: BPE over the file's vocabulary
    and merges (Llama 3 with ignore_merges), split by tokenizer.json's regex, byte-level, the
    special tokens added (CONTROL ones as special)."""
    hf = pytest.importorskip("tokenizers")
    tokens = model.metadata("tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ", 1)) for merge in model.metadata("tokenizer.ggml.merges")]
    tokenizer = hf.Tokenizer(hf.models.BPE({text: token for token, text in enumerate(tokens)}, merges,
                                           ignore_merges=arch == "llama"))
    tokenizer.pre_tokenizer = hf.pre_tokenizers.Sequence([
        hf.pre_tokenizers.Split(hf.Regex(HF_PATTERNS[arch]), behavior="isolated"),
        hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = hf.decoders.ByteLevel()
    types = model.metadata("tokenizer.ggml.token_type")
    tokenizer.add_special_tokens([hf.AddedToken(text, special=True, normalized=False) for text, kind in zip(tokens, types)
                                  if kind == CONTROL])
    tokenizer.add_tokens([hf.AddedToken(text, special=False, normalized=False) for text, kind in zip(tokens, types)
                          if kind == gguf.TokenType.USER_DEFINED])
    return tokenizer


@pytest.fixture(scope="module")
def references(models):
    return {arch: hugging_face(model, arch) for arch, model in models.items()}


@pytest.mark.parametrize("arch", list(ARCH))
@examples
@given(text=assigned_texts)
def test_encode_and_decode_agree_with_hugging_face_tokenizers(tokenizers, references, arch, text):
    tokenizer, reference = tokenizers[arch], references[arch]
    ids = tokenizer.encode(text)
    assert ids == bos(tokenizer, arch) + reference.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=False)


# --- files whose text ptxgen does not read ----------------------------------------------------------------
@pytest.mark.parametrize("key, value, message", [
    ("tokenizer.ggml.model", "llama", r"tokenizer\.ggml\.model = 'llama': ptxgen turns text into tokens and back only "
                                      r"for byte-level BPE \('gpt2', as Qwen2/3 and Llama 3 files\); give token ids "
                                      r"with --tokens"),
    ("tokenizer.ggml.pre", "gpt-4o", r"tokenizer\.ggml\.pre = 'gpt-4o': not a pre-tokenizer ptxgen knows \(qwen2, "
                                     r"deepseek-r1-qwen, llama-bpe, llama3, llama-v3\); give token ids with --tokens"),
])
def test_other_tokenizers_are_refused_when_text_is_needed(models, tmp_path, key, value, message):
    path = rewrite_gguf(models["qwen3"].path, tmp_path / "other.gguf", drop_fields=(key,),
                        set_fields=[(key, value, gguf.GGUFValueType.STRING)])
    tokenizer = Tokenizer(GGUFModel(path))
    assert tokenizer.end_of_generation == Tokenizer(models["qwen3"]).end_of_generation, "ids still work"
    with pytest.raises(PtxgenError, match=message):
        tokenizer.encode("hello")
    if key == "tokenizer.ggml.model":
        assert regex.search(message, tokenizer.undecodable(1000))
        with pytest.raises(PtxgenError, match=message):
            tokenizer.decode([1, 2])
    else:  # decoding does not depend on the pre-tokenizer
        assert tokenizer.undecodable(1000) is None
        assert tokenizer.decode(Tokenizer(models["qwen3"]).encode("hello")) == "hello"


STRING, BOOL, ARRAY = gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL, gguf.GGUFValueType.ARRAY


@pytest.mark.parametrize("key, value, vtype, message", [
    ("tokenizer.ggml.pre", ["qwen2"], ARRAY, r"tokenizer\.ggml\.pre must be str, got list"),
    ("tokenizer.ggml.merges", "a b", STRING, r"tokenizer\.ggml\.merges must be a list of strs, got str"),
    ("tokenizer.ggml.add_bos_token", "false", STRING, r"tokenizer\.ggml\.add_bos_token must be bool, got str"),
    ("tokenizer.ggml.token_type", "1", STRING, r"tokenizer\.ggml\.token_type must be a list of ints, got str"),
    ("tokenizer.ggml.tokens", [1, 2], ARRAY, r"tokenizer\.ggml\.tokens must be a list of strs, got list"),
])
def test_tokenizer_metadata_of_the_wrong_type_is_named(models, tmp_path, key, value, vtype, message):
    """A converter's mistake (a list where a string belongs, "false" for a bool) is one error
    naming the key when text is needed, not a TypeError; token ids still work."""
    path = rewrite_gguf(models["qwen3"].path, tmp_path / "typed.gguf", drop_fields=(key,),
                        set_fields=[(key, value, vtype)])
    tokenizer = Tokenizer(GGUFModel(path))
    with pytest.raises(PtxgenError, match=message):
        tokenizer.encode("hello")


def test_a_merge_listed_twice_keeps_its_first_rank(models, tmp_path):
    """As llama.cpp reads merges: the second listing of a pair gives it no later rank."""
    merges = models["qwen3"].metadata("tokenizer.ggml.merges")
    path = rewrite_gguf(models["qwen3"].path, tmp_path / "twice.gguf", drop_fields=("tokenizer.ggml.merges",),
                        set_fields=[("tokenizer.ggml.merges", merges + [merges[0]], ARRAY)])
    assert merges[0] == "Ġ t", "the fixture's first merge, which ' this' needs before ('t', 'h')"
    text = "is this that, than this"
    assert Tokenizer(GGUFModel(path)).encode(text) == Tokenizer(models["qwen3"]).encode(text)


def test_a_model_with_more_outputs_than_tokens_has_no_text(models, tmp_path):
    """The lm_head's rows past the tokenizer's list have no text: said before any work."""
    tokens = models["qwen3"].metadata("tokenizer.ggml.tokens")
    types = models["qwen3"].metadata("tokenizer.ggml.token_type")
    path = rewrite_gguf(models["qwen3"].path, tmp_path / "short.gguf",
                        drop_fields=("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"),
                        set_fields=[("tokenizer.ggml.tokens", tokens[:900], ARRAY),
                                    ("tokenizer.ggml.token_type", types[:900], ARRAY)])
    tokenizer = Tokenizer(GGUFModel(path))
    assert tokenizer.undecodable(900) is None
    assert regex.search(r"short\.gguf: the model outputs 1000 token ids, its tokenizer \(tokenizer\.ggml\.tokens\) "
                        r"names 900", tokenizer.undecodable(1000))


def test_a_file_without_a_tokenizer(models, tmp_path):
    path = rewrite_gguf(models["qwen3"].path, tmp_path / "bare.gguf",
                        drop_fields=[key for key in models["qwen3"].reader.fields if key.startswith("tokenizer.")])
    tokenizer = Tokenizer(GGUFModel(path))
    assert tokenizer.end_of_generation == frozenset()
    with pytest.raises(PtxgenError, match=r"metadata key 'tokenizer\.ggml\.model' is missing"):
        tokenizer.encode("hello")


# --- end of generation ----------------------------------------------------------------------------------
def test_end_of_generation_ids(tokenizers, models, tmp_path):
    """The eos/eot/eom ids and the tokens of llama.cpp's end texts (Qwen3: <|im_end|> is eos,
    <|endoftext|> by its text; Llama 3: <|end_of_text|> is eos, <|eot_id|> by its text)."""
    for arch, ends in (("qwen3", {"<|im_end|>", "<|endoftext|>"}), ("llama", {"<|end_of_text|>", "<|eot_id|>"})):
        tokenizer = tokenizers[arch]
        assert {tokenizer.tokens[t] for t in tokenizer.end_of_generation} == ends
        assert tokenizer.tokens[models[arch].metadata("tokenizer.ggml.eos_token_id")] in ends
    path = rewrite_gguf(models["qwen3"].path, tmp_path / "eot.gguf",
                        set_fields=[("tokenizer.ggml.eot_token_id", 7, gguf.GGUFValueType.UINT32)])
    assert 7 in Tokenizer(GGUFModel(path)).end_of_generation
