"""Spec generation from a model: every kernel of the decode step (the fused decoder, its separate
step's kernels, the head) and prefill, specs of every GEMV type valid with today's kinds, files
never replaced unasked. That the spec lists what `ptxgen generate` runs: test_generate."""

import dataclasses
import json
from collections import Counter
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from fixtures.make_tiny_gguf import tiny_config, write_tiny_gguf

from ptxgen.errors import PtxgenError
from ptxgen.generate import step_kernels
from ptxgen.model_config import from_hf_config
from ptxgen.spec import load_spec
from ptxgen.kernels import config_from_json
from ptxgen.specgen import (GEMV_KINDS, decoder_kernel, model_prefix, spec_from_gguf, spec_from_hf_config, spec_text,
                            write_spec)

ROOT = Path(__file__).resolve().parents[1]
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
            "max_position_embeddings": 40960, "vocab_size": 151936, "tie_word_embeddings": False,
            "rope_scaling": None, "torch_dtype": "bfloat16"}
ONE_OF_EACH = ["persistent_decoder", "rmsnorm", "rope", "rope", "swiglu", "residual_add", "kv_append",
               "incremental_attention", "argmax", "flash_attention"]


def kernels(text: str) -> list[dict]:
    return tomllib.loads(text)["kernels"]


def hf_config(tmp_path, **changes) -> Path:
    path = tmp_path / "Qwen3-8B" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**QWEN3_8B, **changes}))
    return path


def test_mixed_fixture_spec(tmp_path):
    config = tiny_config()
    text = spec_from_gguf(write_tiny_gguf(tmp_path / "m.gguf"))
    assert text == spec_text(config, "m.gguf"), "the spec comes from the file's config, and deterministically"
    entries = kernels(text)
    assert len({e["name"] for e in entries}) == len(entries) and all(e["name"].startswith("tiny_qwen3_") for e in entries)
    # Layer 0: q, k Q4_K and v Q6_K, o Q4_K, down Q6_K; layer 1: q, k, v, o Q8_0, down Q4_K; gate
    # and up Q4_K; lm_head Q6_K. A norm group per type of its matrices in a layer, a GEMV per
    # (type, n, k) of o and down (both 256 x 512 here), the lm_head's.
    groups = [(e["kind"], e["matrices"]) for e in entries if "matrices" in e]
    assert groups == [("fused_rmsnorm_q4k_gemv_group", {"q": 512, "k": 256}),
                      ("fused_rmsnorm_q6k_gemv_group", {"v": 256}),
                      ("fused_rmsnorm_q4k_gemv_group", {"gate": 512, "up": 512}),
                      ("fused_rmsnorm_q8_0_gemv_group", {"q": 512, "k": 256, "v": 256})]
    gemvs = [(e["kind"], e["n"], e["k"]) for e in entries if e["kind"] in GEMV_KINDS.values()]
    assert gemvs == [("q4k_gemv", 256, 512), ("q6k_gemv", 256, 512), ("q8_0_gemv", 256, 512), ("q6k_gemv", 1000, 256)]
    others = Counter(e["kind"] for e in entries if e["kind"] not in GEMV_KINDS.values() and "matrices" not in e)
    assert others == Counter(ONE_OF_EACH + ["per_head_rmsnorm"] * 2)
    # The fused decoder with each layer's types (generate takes it from decoder_kernel too).
    decoder = decoder_kernel(config, "tiny_qwen3", 256)
    assert config_from_json(next(e for e in entries if e["kind"] == "persistent_decoder")) == config_from_json(decoder)
    assert decoder["kind"] == "persistent_decoder" and (decoder["num_layers"], decoder["max_seq_len"]) == (2, 256)
    assert decoder["weight_quants"]["wv"] == tuple(config.quants[f"blk.{i}.attn_v.weight"] for i in range(2)) == (
        "q6_k", "q8_0")
    assert "wq" in decoder["weight_quants"] and "w_up" not in decoder["weight_quants"], "only weights not all Q4_K"
    assert "rope_style" not in decoder and "qk_norm" not in decoder, "Qwen3 needs neither field"
    assert config_from_json(decoder).weight_quants == decoder["weight_quants"], "the kind takes it"


def test_q4k_only_spec_validates_with_todays_kinds(tmp_path):
    out = tmp_path / "tiny.toml"
    write_spec(spec_from_gguf(write_tiny_gguf(tmp_path / "q4k.gguf", quant="q4_k")), out)
    loaded = load_spec(out)
    kinds = Counter(k.kind for k in loaded.spec.kernels)
    assert kinds["q4k_gemv"] == 2 and kinds["fused_rmsnorm_q4k_gemv_group"] == 2  # o|down, lm_head; qkv, gate/up


def test_qwen3_8b_from_hf_config_matches_the_hand_written_specs(tmp_path):
    """Every generated kernel but the lm_head is, name aside, one of specs/qwen3*.toml's (the
    fused norm + GEMV groups included)."""
    out = tmp_path / "qwen3_8b.toml"
    write_spec(spec_from_hf_config(hf_config(tmp_path), "q4_k"), out)
    ours = load_spec(out).spec.kernels
    hand = [*load_spec(ROOT / "specs/qwen3.toml").spec.kernels, *load_spec(ROOT / "specs/qwen3_decoder.toml").spec.kernels]

    def unnamed(kernel) -> str:
        return json.dumps(kernel.model_dump(exclude={"name"}), sort_keys=True)

    known = {unnamed(k) for k in hand}
    assert all(k.name.startswith("qwen3_8b_") for k in ours)
    assert [k.name for k in ours if unnamed(k) not in known] == ["qwen3_8b_lm_head"]
    lm_head = next(k for k in ours if k.name == "qwen3_8b_lm_head")
    assert (lm_head.kind, lm_head.n, lm_head.k) == ("q4k_gemv", 151936, 4096)
    # (The hand-written specs also hold single fused norm + GEMVs and groups without the norm, which
    # the decode step does not launch, and Q6_K and Q8_0 GEMVs, which an all-Q4_K model does not need.)
    assert {k.kind for k in ours} == {k.kind for k in hand} - {"fused_rmsnorm_q4k_gemv", "q4k_gemv_group", "q6k_gemv",
                                                                "q8_0_gemv"}


def test_llama_spec_says_its_rope_and_has_no_qk_norm(tmp_path):
    entries = kernels(spec_from_gguf(write_tiny_gguf(tmp_path / "l.gguf", "llama", tied=True, quant="q8_0")))
    ropes = [e for e in entries if e["kind"] == "rope"]
    assert len(ropes) == 2 and all(e["style"] == "interleaved" for e in ropes)
    decoder = decoder_kernel(tiny_config("llama", tied=True, quant="q8_0"), "tiny_llama", 256)
    fused = next(e for e in entries if e["kind"] == "persistent_decoder")
    assert config_from_json(fused) == config_from_json(decoder), "Q8_0 layers, fused"
    assert decoder["rope_style"] == "interleaved" and decoder["qk_norm"] is False
    assert decoder["weight_quants"] == {w: ("q8_0", "q8_0") for w in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
    assert not [e for e in entries if e["kind"] == "per_head_rmsnorm"]
    lm_head = next(e for e in entries if e["name"].endswith("lm_head"))
    assert (lm_head["kind"], lm_head["n"], lm_head["k"]) == ("q8_0_gemv", 1000, 256), "tied: token_embd's type"


def test_options_and_names():
    config = tiny_config(quant="q4_k")
    entries = kernels(spec_text(config, "x", max_seq_len=64, prefix="mine"))
    assert all(e["name"].startswith("mine_") for e in entries)
    assert {e["max_seq_len"] for e in entries if "max_seq_len" in e} == {64}
    assert model_prefix("Qwen3 8B") == "qwen3_8b"
    assert model_prefix("8B-chat!!") == "model_8b_chat"
    assert model_prefix("Meta-Llama-3.1-8B-Instruct-Q4_K_M") == "meta_llama_3_1_8b_instru"
    assert model_prefix("???") == "model"
    with pytest.raises(PtxgenError, match="--max-seq-len: expected at least 1, got -1"):
        spec_text(config, "x", max_seq_len=-1)
    with pytest.raises(PtxgenError, match="prefix must be an identifier"):
        spec_text(config, "x", prefix="8b-model")


def test_weights_without_a_gemv_kind_are_named():
    config = tiny_config()
    f16 = dataclasses.replace(config, quants={**config.quants, "blk.1.ffn_up.weight": "f16"})
    with pytest.raises(PtxgenError, match=r"tensor 'blk\.1\.ffn_up\.weight' is F16; there is no GEMV kernel of that "
                                          r"type \(supported: Q4_K, Q6_K, Q8_0\)"):
        spec_text(f16, "x")


def test_a_decoder_without_a_fused_kernel_is_left_out_and_the_spec_says_why():
    """ffn_gate and ffn_up of different types in a layer: the spec has the separate kernels only."""
    config = tiny_config()
    split = dataclasses.replace(config, quants={**config.quants, "blk.1.ffn_up.weight": "q8_0"})
    text = spec_text(split, "x")
    assert "persistent_decoder" not in {e["kind"] for e in kernels(text)}
    assert "# --- Whole decoder layers in one launch: none (weight_quants: w_gate and w_up differ in layer(s) 1;" in text


def test_prefill_attention_the_model_cannot_have_is_left_out_and_decode_still_runs():
    """head_dim 256: flash_attention takes 64 and 128 only, but decode (what generate runs) needs
    no prefill kernel: the spec leaves it out and says why."""
    config = dataclasses.replace(tiny_config(), head_dim=256)
    text = spec_text(config, "x")
    assert "flash_attention" not in {e["kind"] for e in kernels(text)}
    assert "# --- Prefill attention: none (flash_attention head_dim: Input should be 64 or 128 (got 256))" in text
    assert step_kernels(config, 16).decoder.head_dim == 256


def test_write_spec_never_replaces_unasked(tmp_path):
    out = tmp_path / "spec.toml"
    out.write_text("mine")
    with pytest.raises(PtxgenError, match="already exists; refusing to replace it"):
        write_spec("new\n", out)
    assert out.read_text() == "mine"
    write_spec("new\n", out, overwrite=True)
    assert out.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["spec.toml"], "no temporary file left behind"
    with pytest.raises(PtxgenError, match="spec.toml is a file, not a folder"):
        write_spec("x", out / "below_a_file.toml")


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "mistral"}, r"model_type 'mistral' is not supported \(supported: qwen3, llama\)"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope scaling .* is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling .* is not supported"),
    ({"rope_scaling": "linear"}, "rope scaling 'linear' is not supported"),
    ({"hidden_size": None}, "missing 'hidden_size'"),
    ({"num_attention_heads": "32"}, r"'num_attention_heads' must be an integer, got '32'"),
    ({"tie_word_embeddings": 1}, r"'tie_word_embeddings' must be true or false"),
    ({"num_key_value_heads": 7}, r"num_kv_heads \(config.json's 'num_key_value_heads'\) = 7 must divide "
                                 r"num_heads \(config.json's 'num_attention_heads'\) = 32"),
    # rope_theta in rope_parameters (transformers >= 5) is held to the top-level key's rules
    ({"rope_parameters": {"rope_theta": "1e6"}}, r"config\.json: 'rope_parameters\.rope_theta' must be a number, "
                                                 r"got '1e6'"),
    ({"rope_theta": "1e6"}, r"config\.json: 'rope_theta' must be a number, got '1e6'"),
    ({"rope_parameters": {"rope_theta": 0}}, r"rope_theta \(config\.json's 'rope_parameters\.rope_theta'\) must be a "
                                             r"finite number above 1, got 0\.0"),
    ({"rope_theta": 0}, r"rope_theta \(config\.json's 'rope_theta'\) must be a finite number above 1, got 0\.0"),
    ({"rope_theta": 10**400}, r"rope_theta \(config\.json's 'rope_theta'\) must be a finite number above 1, got inf"),
    ({"rms_norm_eps": -10**400}, r"eps \(config\.json's 'rms_norm_eps'\) must be in \(0, 1\), got -inf"),
])
def test_hf_config_errors(tmp_path, changes, message):
    with pytest.raises(PtxgenError, match=message):
        from_hf_config(hf_config(tmp_path, **changes), "q4_k")


@pytest.mark.parametrize("rope, message", [
    ("abc", "'rope_parameters' must be an object, got 'abc'"),
    (5, "'rope_parameters' must be an object, got 5"),
    ([1, 2], "'rope_parameters' must be an object, got [1, 2]"),
    ({"rope_theta": "abc"}, "'rope_parameters.rope_theta' must be a number, got 'abc'"),
    ({"rope_theta": [1]}, "'rope_parameters.rope_theta' must be a number, got [1]"),
])
def test_malformed_rope_parameters_are_one_message(tmp_path, rope, message):
    """What gave an AttributeError, ValueError or TypeError traceback: exit 2, the file and key named."""
    from helpers import run_cli_in_process

    path = hf_config(tmp_path, rope_parameters=rope)
    result = run_cli_in_process("spec", "from-hf", str(path), "--quant", "q4_k", "-o", str(tmp_path / "spec.toml"))
    assert (result.returncode, result.stderr) == (2, f"error: {path}: {message}\n")
    assert not (tmp_path / "spec.toml").exists()


def test_hf_config_file_errors(tmp_path):
    with pytest.raises(PtxgenError, match="cannot read config"):
        from_hf_config(tmp_path / "none.json", "q4_k")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PtxgenError, match="not a JSON config"):
        from_hf_config(bad, "q4_k")
    with pytest.raises(PtxgenError, match="unsupported tensor type 'q5_k'"):
        from_hf_config(hf_config(tmp_path), "q5_k")


def test_plain_rope_named_default_and_the_cli_s_own_words(tmp_path):
    """rope_scaling {"rope_type": "default"} (or "type") is plain rope, as rope_parameters' is; --quant
    names only the types a GEMV takes; an empty --prefix is refused, not replaced by the model's."""
    from helpers import run_cli_in_process

    for scaling in ({"rope_type": "default"}, {"type": "default"}):
        assert from_hf_config(hf_config(tmp_path, rope_scaling=scaling), "q4_k").rope_theta > 1
    path = hf_config(tmp_path)
    for args, message in ((["--quant", "q4_k_m"], "--quant: expected one of q4_k, q6_k, q8_0 (a type with a GEMV "
                                                  "kernel), got 'q4_k_m'"),
                          (["--quant", "f16"], "--quant: expected one of q4_k, q6_k, q8_0"),
                          (["--quant", "q4_k", "--prefix", ""], "kernel name prefix must be an identifier"),
                          (["--quant", "q4_k", "--max-seq-len", "0"], "--max-seq-len: expected at least 1, got 0")):
        result = run_cli_in_process("spec", "from-hf", str(path), *args)
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1, result


def test_hf_config_defaults_and_rope_parameters(tmp_path):
    path = hf_config(tmp_path, head_dim=None, num_key_value_heads=None, rope_theta=None,
                     rope_parameters={"rope_type": "default", "rope_theta": 5e5}, tie_word_embeddings=True)
    config = from_hf_config(path, "q6_k")
    assert (config.head_dim, config.num_kv_heads, config.rope_theta) == (128, 32, 5e5)
    assert config.tied_embeddings and config.lm_head.name == "token_embd.weight" and config.name == "Qwen3-8B"
    assert set(config.quants.values()) == {"q6_k"} and len(config.quants) == 1 + 36 * 7


def test_spec_commands_write_a_spec_that_builds(tmp_path):
    from helpers import run_cli

    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, quant="q4_k")
    printed = run_cli("spec", "from-gguf", str(model))
    assert printed.returncode == 0, printed.stderr
    spec = tmp_path / "tiny.toml"
    written = run_cli("spec", "from-gguf", str(model), "-o", str(spec))
    assert written.returncode == 0 and spec.read_text() == printed.stdout
    again = run_cli("spec", "from-gguf", str(model), "-o", str(spec))
    assert again.returncode == 2 and "already exists" in again.stderr
    built = run_cli("build", str(spec), "-o", str(tmp_path / "out"), "--arch", "sm_90", "-q")
    assert built.returncode == 0, built.stderr
    missing = run_cli("spec", "from-gguf", str(tmp_path / "none.gguf"))
    assert missing.returncode == 2 and "none.gguf" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("changes, named", [
    ({"hidden_size": 100}, r"kernel 'qwen3_8b_decoder' .*hidden: expected a multiple of 256 .* got 100"),
    ({"head_dim": 96}, r"kernel 'qwen3_8b_decoder' .*head_dim: expected one of 64, 128, 256, got 96"),
    ({"vocab_size": 2_000_000_000}, r"kernel 'qwen3_8b_argmax' .*n: .* 1073741824 \(got 2000000000\)"),
])
def test_a_model_whose_shapes_a_kind_refuses_gets_one_message_and_no_file(tmp_path, changes, named):
    """What the generated spec would fail at (a kernel's field, its value) is said at generation,
    as `ptxgen validate` would say it, and nothing is written."""
    from helpers import run_cli

    out = tmp_path / "spec.toml"
    result = run_cli("spec", "from-hf", str(hf_config(tmp_path, **changes)), "--quant", "q4_k", "-o", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Qwen3-8B: no spec for this model" in result.stderr
    import re

    assert re.search(named, result.stderr), result.stderr
    assert not out.exists()


def test_max_seq_len_past_what_the_kinds_take_names_the_option(tmp_path):
    """Past the model's context: refused. Past the decode kinds' 2^24 positions (a model whose context
    is longer): refused naming --max-seq-len; so is 2^24, where the decoder's per-layer cache would
    pass 4 GiB: its config, whose separate step lists the layers' kernels, refuses it (as generate
    does), so the layers have no kernels to list."""
    with pytest.raises(PtxgenError, match=r"--max-seq-len 40961: above the model's context_length \(config\.json's "
                                          r"'max_position_embeddings'\) = 40960"):
        spec_from_hf_config(hf_config(tmp_path), "q4_k", max_seq_len=40961)
    long = hf_config(tmp_path, max_position_embeddings=1 << 25)
    with pytest.raises(PtxgenError, match=r"\(--max-seq-len 16777217\): kernel 'qwen3_8b_decoder' .*max_seq_len"):
        spec_from_hf_config(long, "q4_k", max_seq_len=(1 << 24) + 1)
    with pytest.raises(PtxgenError, match=r"\(--max-seq-len 16777216\): kernel 'qwen3_8b_decoder' .*a layer's cache "
                                          r"must be below 4 GiB"):
        spec_from_hf_config(long, "q4_k", max_seq_len=1 << 24)
    text = spec_from_hf_config(long, "q4_k", max_seq_len=1 << 20)
    assert {e["max_seq_len"] for e in kernels(text) if "max_seq_len" in e} == {1 << 20}
    load_spec_text(tmp_path, text)


def test_a_context_length_past_what_the_kinds_take_names_the_file_and_key(tmp_path):
    """No --max-seq-len: the cache would take the model's context length, so a length the kinds
    refuse is the file's (its metadata key or config.json key) and --max-seq-len the way out."""
    import gguf
    from fixtures.make_tiny_gguf import rewrite_gguf
    from helpers import run_cli_in_process

    model = rewrite_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "long.gguf",
                         drop_fields=["qwen3.context_length"],
                         set_fields=[("qwen3.context_length", 1 << 40, gguf.GGUFValueType.UINT64)])
    out = tmp_path / "spec.toml"
    result = run_cli_in_process("spec", "from-gguf", str(model), "-o", str(out))
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.startswith("error: long.gguf: no spec for this model: context_length (metadata "
                                    "'qwen3.context_length') = 1099511627776 is past what the kernels take (kernel "
                                    "'tiny_qwen3_decoder' "), result.stderr
    assert result.stderr.endswith("(got 1099511627776)); pass a smaller --max-seq-len\n")
    assert run_cli_in_process("spec", "from-gguf", str(model), "--max-seq-len", "64", "-o", str(out)).returncode == 0
    with pytest.raises(PtxgenError, match=r"config\.json with q4_k weights: no spec for this model: context_length "
                                          r"\(config\.json's 'max_position_embeddings'\) = 33554432 is past what"):
        spec_from_hf_config(hf_config(tmp_path, max_position_embeddings=1 << 25), "q4_k")


def test_a_spec_name_in_capitals_is_written_and_loads(tmp_path):
    """-o SPEC.TOML: a .toml file name in another case (refused before), written as named."""
    from helpers import run_cli_in_process

    out = tmp_path / "SPEC.TOML"
    result = run_cli_in_process("spec", "from-hf", str(hf_config(tmp_path)), "--quant", "q4_k", "-o", str(out))
    assert result.returncode == 0, result
    assert sorted(path.name for path in tmp_path.iterdir()) == ["Qwen3-8B", "SPEC.TOML"]
    assert load_spec(out).spec.kernels


def load_spec_text(tmp_path, text: str):
    path = tmp_path / "generated.toml"
    path.write_text(text)
    return load_spec(path)


def test_the_spec_is_written_as_toml_only(tmp_path):
    """-o of another extension is refused before the model is read (the model path does not exist)."""
    from helpers import run_cli

    for name in ("spec.yaml", "spec.txt"):
        result = run_cli("spec", "from-gguf", str(tmp_path / "absent.gguf"), "-o", str(tmp_path / name))
        assert result.returncode == 2 and f"{name}: the spec is written as TOML" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())
