"""The float64 whole-model reference against an independent formulation: all positions at once
with a causal mask, rope as complex rotations, weights straight from gguf-py's reader."""

import gguf
import numpy as np
import pytest
from fixtures.make_tiny_gguf import rewrite_gguf, write_tiny_gguf

from ptxgen.errors import PtxgenError
from ptxgen.gguf_model import GGUFModel
from ptxgen.model_reference import ReferenceModel, generate

PROMPT = [5, 999, 17, 17, 256, 3, 640, 1, 998]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        "qwen3": write_tiny_gguf(root / "qwen3.gguf"),
        "llama": write_tiny_gguf(root / "llama.gguf", "llama", seed=1),
        "qwen3-tied": write_tiny_gguf(root / "qwen3-tied.gguf", tied=True, seed=2),
    }


def sequence_logits(path, tokens) -> np.ndarray:
    """Logits at every position of `tokens` [T, vocab], written apart from ptxgen: the whole
    sequence in one pass, causal mask, rope by complex multiplication."""
    reader = gguf.GGUFReader(path)
    meta = {key: field.contents() for key, field in reader.fields.items()}
    arch = meta["general.architecture"]
    w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
    heads, groups = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    dim, theta = meta[f"{arch}.attention.key_length"], meta[f"{arch}.rope.freq_base"]
    eps = meta[f"{arch}.attention.layer_norm_rms_epsilon"]
    steps = len(tokens)

    def norm(v, gain):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * gain

    turn = np.exp(1j * np.arange(steps)[:, None, None] * theta ** (-np.arange(0, dim, 2) / dim))  # [T, 1, dim/2]

    def rotate(v):  # [T, heads, dim]
        out = np.empty_like(v)
        if arch == "llama":  # GGUF llama rows: adjacent pairs
            z = (v[..., 0::2] + 1j * v[..., 1::2]) * turn
            out[..., 0::2], out[..., 1::2] = z.real, z.imag
        else:  # qwen3: first half with second half
            z = (v[..., : dim // 2] + 1j * v[..., dim // 2:]) * turn
            out[..., : dim // 2], out[..., dim // 2:] = z.real, z.imag
        return out

    x = w["token_embd.weight"][tokens]
    future = np.triu(np.ones((steps, steps), bool), 1)
    for layer in range(meta[f"{arch}.block_count"]):
        p = f"blk.{layer}."
        a = norm(x, w[p + "attn_norm.weight"])
        q = (a @ w[p + "attn_q.weight"].T).reshape(steps, heads, dim)
        k = (a @ w[p + "attn_k.weight"].T).reshape(steps, groups, dim)
        v = (a @ w[p + "attn_v.weight"].T).reshape(steps, groups, dim)
        if arch == "qwen3":
            q, k = norm(q, w[p + "attn_q_norm.weight"]), norm(k, w[p + "attn_k_norm.weight"])
        q, k = rotate(q), np.repeat(rotate(k), heads // groups, axis=1)
        v = np.repeat(v, heads // groups, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(dim)
        scores[:, future] = -np.inf
        attention = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attention /= attention.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", attention, v).reshape(steps, heads * dim)
        x = x + o @ w[p + "attn_output.weight"].T
        m = norm(x, w[p + "ffn_norm.weight"])
        gate, up = m @ w[p + "ffn_gate.weight"].T, m @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    head = w.get("output.weight", w["token_embd.weight"])
    return norm(x, w["output_norm.weight"]) @ head.T


@pytest.mark.parametrize("name", ["qwen3", "llama", "qwen3-tied"])
def test_decode_steps_match_the_whole_sequence_formulation(files, name):
    logits = ReferenceModel(GGUFModel(files[name])).run(PROMPT)
    expect = sequence_logits(files[name], PROMPT)
    assert logits.shape == (len(PROMPT), 1000)
    # Both float64; they differ only in summation order and in cos/sin vs complex exp. Measured
    # 1.9e-15 (qwen3), 1.9e-13 (llama: without Q/K norms its attention scores are large, and the
    # softmax scales absolute differences by them); swapping the rope style gives 0.22.
    err = np.abs(logits - expect).max() / np.abs(expect).max()
    assert err < 1e-11, f"{name}: max relative logit difference {err:.2e}"


def test_generate_is_greedy_and_deterministic(files):
    model = GGUFModel(files["qwen3"])
    first = generate(model, PROMPT[:4], 6)
    assert first.prompt == PROMPT[:4] and len(first.tokens) == 6 and first.logits.shape == (6, 1000)
    assert first.tokens == [int(np.argmax(row)) for row in first.logits]
    second = generate(GGUFModel(files["qwen3"]), PROMPT[:4], 6)
    assert second.tokens == first.tokens
    np.testing.assert_array_equal(second.logits, first.logits)
    # Step i's logits are those of the prompt plus the first i generated tokens.
    replay = ReferenceModel(model).run(PROMPT[:4] + first.tokens[:-1])[3:]
    np.testing.assert_array_equal(replay, first.logits)
    assert generate(model, [3], 0).logits.shape == (0, 1000)


def test_tied_head_is_the_embedding(files, tmp_path):
    """The tied file with token_embd's bytes added as output.weight gives the same logits."""
    tied = files["qwen3-tied"]
    reader = gguf.GGUFReader(tied)
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    untied = rewrite_gguf(tied, tmp_path / "untied.gguf",
                          add_tensors=[("output.weight", np.array(embedding.data), embedding.tensor_type)])
    assert GGUFModel(untied).config.lm_head.name == "output.weight"
    np.testing.assert_array_equal(ReferenceModel(GGUFModel(untied)).run(PROMPT[:3]),
                                  ReferenceModel(GGUFModel(tied)).run(PROMPT[:3]))


# Measured max |logit difference| / max |logit| with the cache rounded to f16 vs kept in float64,
# 9 prompt steps on the qwen3 fixture: 2.2e-4 (f16 keeps 2^-11 of each k and v element).
F16_CACHE_EFFECT = 1e-3


def test_kv_cache_rounding(files):
    model = GGUFModel(files["qwen3"])
    exact = ReferenceModel(model).run(PROMPT)
    rounded = ReferenceModel(model, kv_dtype="f16").run(PROMPT)
    err = np.abs(rounded - exact).max() / np.abs(exact).max()
    assert 0 < err < F16_CACHE_EFFECT, err


def test_bad_requests(files):
    model = GGUFModel(files["qwen3"])
    with pytest.raises(PtxgenError, match=r"token 1000 is outside the vocabulary \(0\.\.999\)"):
        generate(model, [1, 1000], 2)
    with pytest.raises(PtxgenError, match="token -1"):
        ReferenceModel(model).step(-1)
    with pytest.raises(PtxgenError, match="at least one prompt token"):
        generate(model, [], 2)
    with pytest.raises(PtxgenError, match="max_new must be >= 0"):
        generate(model, [1], -1)
