"""`ptxgen generate` on the tiny fixtures (qwen3 and llama all Q4_K, and a Q4_K_M-like qwen3 that
mixes Q6_K and Q8_0 layers), against the float64 whole-model reference (ptxgen.model_reference),
in the PTX interpreter and on the simulated GPU of tests/simulated_gpu.py (the device path:
buffers, uploads straight from the file's memory map, launches kept from step to step).

Two references, two tolerances:
- tight: the reference with the kernels' int8 activations (quantize_activations) and f16 KV cache,
  teacher forced layer by layer: each layer fed the kernels' own input, cache rows and int8-bound
  vectors (ReferenceModel.layer(forced=...)), so that only f32 arithmetic separates them. Every
  layer's output, attention output, MLP activation and the logits within X_TOL; every new cache
  element within half an f16 ulp of the exact value plus ROW_REL of its head's RMS.
- loose (free running, as a user runs it): an activation or cache element next to a rounding
  boundary may round the other way in f32 than in float64 (measured on these fixtures: an f16
  flip of one k element at pos 1, then int8 flips in the next layer), and everything after it
  follows another sample of the same quantisation noise. So the bound is that noise itself: E =
  the largest relative L2 distance between the int8 reference and the exact float64 model over
  the steps (computed here, ~1.1-1.3e-2 on the fixtures), and the kernels' logits are within 2E
  of both (measured at most 0.9E from the int8 reference, 1.06E from the exact model). The greedy
  tokens equal both references' (measured: every prompt tried).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from fixtures.make_tiny_gguf import rewrite_gguf, tiny_config, write_tiny_gguf

from ptxgen import device
from ptxgen.dtypes import to_float64
from ptxgen.errors import DeviceUnavailable, PtxgenError
from ptxgen.generate import (QWEN3_8B, WHOLE_MODEL_PATHS, Generator, RandomModel, decode_speed, q4_k_m_types,
                             random_model, random_model_decode_speed, step_kernels)
from ptxgen.gguf_model import GGUFModel
from ptxgen.kernels import kind_of
from ptxgen.model_config import ModelConfig
from ptxgen.quants import quant_type
from ptxgen.kernels.argmax import first_argmax
from ptxgen.model_reference import ReferenceModel, generate as reference_generate
from ptxgen.spec import load_spec
from ptxgen.tokenizer import Tokenizer
from ptxgen.verify import relative_l2

from helpers import run_cli_in_process
from simulated_gpu import SimulatedDriver

PROMPT = [5, 999, 17]
MAX_NEW = 4
# f32 pipelines of the same int8 products in other summation orders (measured at most 5e-7 for
# x, attention, MLP and logits on both fixtures, 9 positions; the cache rows within half an ulp).
X_TOL = 1e-5
ROW_REL = 1e-5  # a new cache element's f32 error, relative to its head's RMS (as the decoder's tests)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    return {"qwen3": write_tiny_gguf(root / "qwen3.gguf", quant="q4_k"),
            "llama": write_tiny_gguf(root / "llama.gguf", "llama", seed=1, quant="q4_k"),
            "qwen3-tied": write_tiny_gguf(root / "qwen3-tied.gguf", seed=2, tied=True, quant="q4_k"),
            "mixed": write_tiny_gguf(root / "mixed.gguf"),
            # ffn_gate Q4_K and ffn_up Q8_0 in layer 0: no fused decoder (one task computes both rows)
            "split": rewrite_gguf(write_tiny_gguf(root / "split-source.gguf"), root / "split.gguf",
                                  drop_tensors=("blk.0.ffn_up.weight",),
                                  add_tensors=[("blk.0.ffn_up.weight", quant_type("q8_0").random_weights(
                                      np.random.default_rng(0), 512, 256), gguf.GGMLQuantizationType.Q8_0)]),
            "nan_norm": poisoned(root, "output_norm.weight", 4, np.float32(np.nan)),
            "inf_scale": poisoned(root, "blk.1.attn_q.weight", 144 * 3, np.float16(-np.inf)),  # block 3's d
            # a context past what the decode kinds take (2^24 positions)
            "long": rewrite_gguf(write_tiny_gguf(root / "long-source.gguf", quant="q4_k"), root / "long.gguf",
                                 drop_fields=("qwen3.context_length",),
                                 set_fields=[("qwen3.context_length", 1 << 25, gguf.GGUFValueType.UINT32)]),
            # a SentencePiece tokenizer's name: ids work, text does not
            "sentencepiece": rewrite_gguf(write_tiny_gguf(root / "spm-source.gguf", quant="q4_k"), root / "spm.gguf",
                                          drop_fields=("tokenizer.ggml.model",),
                                          set_fields=[("tokenizer.ggml.model", "llama", gguf.GGUFValueType.STRING)]),
            # 900 tokens for the lm_head's 1000 rows: the last 100 ids have no text
            "short_vocab": short_vocabulary(write_tiny_gguf(root / "short-source.gguf", quant="q4_k"),
                                            root / "short.gguf", 900),
            }


def short_vocabulary(source: Path, path: Path, tokens: int) -> Path:
    """`source` with its tokenizer's token list (and types) cut to the first `tokens`."""
    model = GGUFModel(source)
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")
    return rewrite_gguf(source, path, drop_fields=keys,
                        set_fields=[(key, model.metadata(key)[:tokens], gguf.GGUFValueType.ARRAY) for key in keys])


def poisoned(root, name: str, at: int, value) -> Path:
    """The tiny model with `value`'s bytes written at byte `at` of tensor `name`."""
    source = write_tiny_gguf(root / f"{name}-source.gguf", quant="q4_k")
    tensor = next(t for t in gguf.GGUFReader(source).tensors if t.name == name)
    data = np.array(tensor.data)
    raw = data.view(np.uint8).reshape(-1)
    raw[at:at + value.nbytes] = np.frombuffer(value.tobytes(), np.uint8)
    kind = None if tensor.tensor_type == gguf.GGMLQuantizationType.F32 else tensor.tensor_type
    return rewrite_gguf(source, root / f"{name}-poisoned.gguf", drop_tensors=(name,), add_tensors=[(name, data, kind)])


def quantisation_noise(model, prompt, tokens) -> float:
    """E: the largest relative L2 distance of the int8-activation reference's logits from the exact
    model's, over the steps that chose `tokens` after `prompt`."""
    history = prompt + tokens[:-1]
    int8 = ReferenceModel(model, "f16", quantize_activations=True).run(history)[len(prompt) - 1:]
    exact = ReferenceModel(model).run(history)[len(prompt) - 1:]
    return max(relative_l2(a, b) for a, b in zip(int8, exact))


def check_against_references(model, prompt, tokens, logits) -> None:
    """The greedy tokens of both references, and logits within 2E of both (module docstring)."""
    int8 = reference_generate(model, prompt, len(tokens), "f16", quantize_activations=True)
    exact = reference_generate(model, prompt, len(tokens))
    assert tokens == int8.tokens == exact.tokens, f"tokens {tokens}, int8 reference {int8.tokens}, exact {exact.tokens}"
    noise = quantisation_noise(model, prompt, tokens)
    assert 1e-3 < noise < 5e-2, f"E = {noise:.2e}: the int8 activations' effect is not what the bound assumes"
    for name, reference in (("int8 reference", int8.logits), ("exact model", exact.logits)):
        for step, (mine, theirs) in enumerate(zip(logits.astype(np.float64), reference)):
            error = relative_l2(mine, theirs)
            assert error <= 2 * noise, f"step {step}: logits vs the {name}: relative L2 {error:.2e} > 2E = {2 * noise:.2e}"


# --- tight: layer by layer, teacher forced ---------------------------------------------------------
def f16_ulp(values: np.ndarray) -> np.ndarray:
    return np.spacing(np.abs(values).astype(np.float16)).astype(np.float64)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_each_layer_and_the_head_match_the_int8_reference(files, arch):
    model = GGUFModel(files[arch])
    c = model.config
    generator = Generator(model, "emulator", max_seq_len=16)
    reference = ReferenceModel(model, "f16", quantize_activations=True)
    memory = generator.memory
    for pos, token in enumerate([5, 999, 17, 256]):
        memory.write("x", reference.embed(token).astype(np.float32))
        calls = generator.layer_calls(pos)
        per_layer = len(calls) // c.num_layers
        assert per_layer == (13 if c.qk_norm else 11)
        for layer in range(c.num_layers):
            x = memory.read("x").astype(np.float64)
            memory.run(calls[layer * per_layer:(layer + 1) * per_layer])
            rows = {name: to_float64(memory.read(f"{name}_cache")[layer, :, pos], "f16") for name in ("k", "v")}
            forced = {**rows, "attn": memory.read("attn").astype(np.float64), "mlp": memory.read("mlp").astype(np.float64)}
            own: dict = {}
            expected = reference.layer(layer, x, pos, forced, own)
            where = f"{arch} pos {pos} layer {layer}"
            for name, mine, theirs in (("x", memory.read("x"), expected), ("attention output", forced["attn"], own["attn"]),
                                       ("MLP activation", forced["mlp"], own["mlp"])):
                error = relative_l2(mine.astype(np.float64), theirs)
                assert error <= X_TOL, f"{where}: {name} relative L2 {error:.2e} > {X_TOL:.0e}"
            for name, row in rows.items():
                exact = own[name]
                bound = 0.5 * f16_ulp(exact) + ROW_REL * np.sqrt(np.mean(exact**2, axis=-1, keepdims=True))
                assert (np.abs(row - exact) <= bound).all(), f"{where}: {name}_cache row off by more than half an f16 ulp"
        reference.position += 1
        memory.run(generator.head_calls())
        logits = generator.logits()
        error = relative_l2(logits.astype(np.float64), reference.head(memory.read("x").astype(np.float64)))
        assert error <= X_TOL, f"{arch} pos {pos}: logits relative L2 {error:.2e}"
        assert int(memory.read("token")[0]) == first_argmax(logits), "argmax on the device is the logits' argmax"


# --- loose: the command as a user runs it ------------------------------------------------------------
@pytest.mark.parametrize("arch, flag, fused", [("qwen3", "--separate", False), ("llama", "--separate", False),
                                               ("llama", None, True), ("mixed", "--separate", False),
                                               ("mixed", "--fused", True), ("split", None, False)],
                         ids=["qwen3", "llama", "llama-fused-by-default", "q4_k_m-mixed", "q4_k_m-mixed-fused",
                              "split-separate-by-default"])
def test_generate_command_matches_the_references(files, tmp_path, arch, flag, fused):
    """The layers fused by default, where the model's types allow it (the split fixture's layer 0
    has ffn_gate Q4_K and ffn_up Q8_0: separate kernels, and a note says why)."""
    out = tmp_path / "logits.npy"
    result = run_cli_in_process("generate", str(files[arch]), "--tokens", ",".join(map(str, PROMPT)),
                                "--max-new", str(MAX_NEW), "--backend", "emulator", "--json", "--save-logits", str(out),
                                *([flag] if flag else []))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["prompt_tokens"] == PROMPT and len(summary["generated_tokens"]) == MAX_NEW
    assert summary["device"] == "PTX interpreter (CPU)" and summary["decode_steps"] == MAX_NEW - 1
    assert summary["tokens_per_s"] > 0 and summary["layers"] == ("persistent_decoder" if fused else "separate kernels")
    note = "note: the layers run as separate kernels: weight_quants: w_gate and w_up differ in layer(s) 0"
    assert (note in result.stderr) == (arch == "split" and flag is None), result.stderr
    logits = np.load(out)
    assert logits.dtype == np.float32 and logits.shape == (MAX_NEW, 1000)
    assert summary["generated_tokens"] == [first_argmax(row) for row in logits]
    check_against_references(GGUFModel(files[arch]), PROMPT, summary["generated_tokens"], logits)


@pytest.mark.parametrize("shape", [dict(hidden=384, num_heads=6, num_kv_heads=3, head_dim=64),
                                   dict(hidden=128, num_heads=2, num_kv_heads=1, head_dim=64, intermediate=256)],
                         ids=["hidden384", "hidden128"])
def test_a_model_the_fused_decoder_cannot_shape_runs_its_separate_kernels(tmp_path, monkeypatch, shape):
    """Q8_0 layers of hidden 384 (no multiple of the fused decoder's 256-weight block) or 128
    (narrower than it), legal Q8_0 rows every separate kind takes: the separate kernels by
    default, with a note, and with --separate; --fused is refused. The fused decoder's shape rules
    had refused both paths (hidden 128 in its config: 'Input should be greater than or equal to
    256', though `spec from-gguf` wrote, built and verified the model's spec; found by probing the
    model path)."""
    from fixtures import make_tiny_gguf

    for key, value in shape.items():
        monkeypatch.setitem(make_tiny_gguf.SHAPE, key, value)
    model_path = write_tiny_gguf(tmp_path / "narrow.gguf", seed=3, quant="q8_0")
    for flag in ([], ["--separate"]):
        result = run_cli_in_process("generate", str(model_path), "--tokens", "1,2", "--max-new", "2", "--max-seq-len",
                                    "8", "--backend", "emulator", "--json", "--save-logits", str(tmp_path / "l.npy"),
                                    *flag)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["layers"] == "separate kernels"
        note = "note: the layers run as separate kernels: hidden: expected a multiple of 256"
        assert (note in result.stderr) == (not flag), result.stderr
        check_against_references(GGUFModel(model_path), [1, 2], summary["generated_tokens"],
                                 np.load(tmp_path / "l.npy"))
    refused = run_cli_in_process("generate", str(model_path), "--tokens", "1", "--max-new", "1", "--backend",
                                 "emulator", "--fused")
    assert refused.returncode == 2 and "--fused: hidden: expected a multiple of 256" in refused.stderr, refused


def test_tied_lm_head_and_plain_output(files):
    result = run_cli_in_process("generate", str(files["qwen3-tied"]), "--tokens", "640,1", "--max-new", "3",
                                "--backend", "emulator")
    assert result.returncode == 0, result.stderr
    tokens = [int(t) for t in result.stdout.strip().split(",")]
    assert tokens == reference_generate(GGUFModel(files["qwen3-tied"]), [640, 1], 3, "f16", True).tokens
    assert "2 prompt + 3 generated tokens on PTX interpreter (CPU) (layers: persistent_decoder)" in result.stderr
    assert "tokens/s over 2 decode steps" in result.stderr


def test_random_model_generates_like_its_reference():
    """The benchmark's weights (RandomModel: no file) through the same path."""
    model = RandomModel(tiny_config(quant="q4_k"), seed=3)
    generator = Generator(model, "emulator", max_seq_len=8)
    result = generator.generate([1, 2], 3, keep_logits=True)
    check_against_references(model, [1, 2], result.tokens, result.logits)
    assert np.array_equal(model.tensor_bytes("blk.1.ffn_up.weight"), RandomModel(model.config, 3).tensor_bytes(
        "blk.1.ffn_up.weight")), "the same weights for the same seed"


# --- the device path, on the simulated GPU ----------------------------------------------------------
@pytest.fixture
def simulated(monkeypatch):
    simulated = SimulatedDriver({})
    monkeypatch.setattr(device, "driver", lambda instead="": simulated)
    monkeypatch.setattr(device, "_SESSIONS", {})
    monkeypatch.setattr(device, "lost_context", None)
    return simulated


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
def test_device_path_on_the_simulated_gpu(files, simulated, monkeypatch, fused):
    """Weights copied once, each straight from the file's memory map; the KV cache and every
    buffer on the device; a step re-packs only the launches whose position changed. (The
    simulated GPU runs each kernel's float64 reference, not its PTX.)"""
    model = GGUFModel(files["llama"])
    gpu = device.session()
    uploads, packed = [], []
    real_upload, real_launcher = gpu.upload, gpu.launcher
    monkeypatch.setattr(gpu, "upload", lambda buffer, array: (uploads.append(array), real_upload(buffer, array))[1])
    monkeypatch.setattr(gpu, "launcher", lambda *args: (packed.append(args[0].entry), real_launcher(*args))[1])
    generator = Generator(model, "device", max_seq_len=16, fused=fused)
    c = model.config
    matrices = [a for a in uploads if a.dtype == np.uint8]
    assert len(matrices) == 7 * c.num_layers + 1, "every layer matrix and the lm_head, once"
    assert all(np.shares_memory(a, model.reader.data) for a in matrices), "a matrix was copied on the host"
    kernels = [call.kernel for call in generator.layer_calls(0) + generator.head_calls()]
    simulated.kernels.update({k.name: k for k in kernels})
    result = generator.generate(PROMPT, MAX_NEW, keep_logits=True)
    check_against_references(model, PROMPT, result.tokens, result.logits)
    assert generator.device == "Simulated GPU"
    # The last step re-packed only what depends on the position.
    before = len(packed)
    generator.step(result.tokens[-1], len(PROMPT) + MAX_NEW - 1)
    # The decoder; or rope q and k (the same launches for every layer) and a layer's kv_append and attention.
    expected = 1 if fused else 2 + 2 * c.num_layers
    assert len(packed) - before == expected, packed[before:]
    generator.close()
    assert not gpu.allocations, "every buffer and workspace freed"


# --- the model's spec --------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen3", "llama", "mixed"])
def test_the_models_spec_builds_and_verifies(files, tmp_path, arch):
    """Every file's spec has the fused decoder (the mixed file's with its per-layer types: Q6_K
    and Q8_0 layers), and every GEMV kind its types need."""
    spec = tmp_path / f"{arch}.toml"
    assert run_cli_in_process("spec", "from-gguf", str(files[arch]), "--max-seq-len", "32", "-o", str(spec)).returncode == 0
    built = run_cli_in_process("build", str(spec), "-o", str(tmp_path / "out"), "--arch", "sm_90", "-q")
    assert built.returncode == 0, built.stderr
    verified = run_cli_in_process("verify", str(spec))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "FAIL" not in verified.stdout and "argmax" in verified.stdout
    kinds = {kernel.kind for kernel in load_spec(spec).spec.kernels}
    assert "persistent_decoder" in kinds
    if arch == "mixed":
        assert {"q4k_gemv", "q6k_gemv", "q8_0_gemv", "fused_rmsnorm_q4k_gemv_group", "fused_rmsnorm_q6k_gemv_group",
                "fused_rmsnorm_q8_0_gemv_group"} <= kinds
        decoder = next(kernel for kernel in load_spec(spec).spec.kernels if kernel.kind == "persistent_decoder")
        assert decoder.weight_quants["wv"] == ("q6_k", "q8_0") and decoder.weight_quants["w_down"] == ("q6_k", "q4_k")


@pytest.mark.parametrize("arch", ["qwen3", "llama", "mixed", "split"])
def test_the_spec_lists_the_kernels_generate_runs(files, tmp_path, arch):
    """`spec from-gguf` lists, in order and field for field, the kernels generate launches: the
    fused decoder where its one launch takes the model (not the split fixture's), each kernel of
    the layers as separate kernels once, the head's; besides them only the prefill attention,
    which generate does not run (the prompt goes through the decode step)."""
    spec = tmp_path / f"{arch}.toml"
    written = run_cli_in_process("spec", "from-gguf", str(files[arch]), "--max-seq-len", "32", "-o", str(spec))
    assert written.returncode == 0, written.stderr
    listed = [kernel for kernel in load_spec(spec).spec.kernels if kernel.kind != "flash_attention"]
    generator = Generator(GGUFModel(files[arch]), "emulator", max_seq_len=32)
    launched = {call.kernel.name: call.kernel for call in generator.layer_calls(0) + generator.head_calls()}
    decoder = [generator.kernels.decoder] if kind_of(generator.kernels.decoder).unbuildable() is None else []
    generator.close()
    assert [kernel.model_dump() for kernel in listed] == [kernel.model_dump() for kernel in
                                                           decoder + list(launched.values())]
    assert (arch == "split") == (not decoder)


def test_the_command_plans_the_step_once(files, monkeypatch):
    """One plan (the model's spec, validated) both chooses the layers' path, with the note why,
    and runs them: the command had planned the step a second time where the fused decoder was
    left out."""
    import ptxgen.generate

    planned = []
    plan = ptxgen.generate.step_kernels

    def counted(*args):
        planned.append(args)
        return plan(*args)

    monkeypatch.setattr(ptxgen.generate, "step_kernels", counted)
    result = run_cli_in_process("generate", str(files["split"]), "--tokens", "1", "--max-new", "1", "--backend",
                                "emulator")
    assert result.returncode == 0, result.stderr
    assert "note: the layers run as separate kernels" in result.stderr
    assert len(planned) == 1, f"the step planned {len(planned)} times"


# --- text in and out: the file's tokenizer ----------------------------------------------------------
TEXT_PROMPT = "Hello <|im_start|>it's 42\n"


def test_generate_takes_a_prompt_and_prints_json_with_the_text(files):
    """--prompt is encoded by the file's tokenizer; --json's text is the generated tokens decoded,
    and stop says why they ended."""
    tokenizer = Tokenizer(GGUFModel(files["qwen3"]))
    result = run_cli_in_process("generate", str(files["qwen3"]), "--prompt", TEXT_PROMPT, "--max-new", "2",
                                "--backend", "emulator", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["prompt_text"] == TEXT_PROMPT
    assert summary["prompt_tokens"] == tokenizer.encode(TEXT_PROMPT)
    assert tokenizer.tokens.index("<|im_start|>") in summary["prompt_tokens"], "a special token matched literally"
    generated = summary["generated_tokens"]
    assert summary["text"] == tokenizer.decode(generated)
    ended = generated[-1] in tokenizer.end_of_generation
    assert summary["stop"] == ("eos" if ended else "max_new") and (ended or len(generated) == 2), summary


def test_generate_prints_the_text_of_the_greedy_tokens(files):
    """Plain output with --prompt: the generated text on stdout (Llama 3's BOS added to the prompt)."""
    model = GGUFModel(files["llama"])
    tokenizer = Tokenizer(model)
    prompt = tokenizer.encode(TEXT_PROMPT)
    assert prompt[0] == model.metadata("tokenizer.ggml.bos_token_id")
    expected = reference_generate(model, prompt, 2, "f16", True).tokens
    result = run_cli_in_process("generate", str(files["llama"]), "--prompt", TEXT_PROMPT, "--max-new", "2",
                                "--backend", "emulator", "--ignore-eos")
    assert result.returncode == 0, result.stderr
    assert result.stdout == tokenizer.decode(expected) + "\n"
    assert f"{len(prompt)} prompt + 2 generated tokens" in result.stderr


def test_generation_stops_at_an_end_of_generation_token(files, tmp_path):
    """As llama.cpp: the file's eos (set here to the second token the model picks) ends the
    generation after it; --ignore-eos runs on to --max-new."""
    expected = reference_generate(GGUFModel(files["qwen3"]), PROMPT, 3, "f16", True).tokens
    path = rewrite_gguf(files["qwen3"], tmp_path / "eos.gguf", drop_fields=("tokenizer.ggml.eos_token_id",),
                        set_fields=[("tokenizer.ggml.eos_token_id", expected[1], gguf.GGUFValueType.UINT32)])
    stops = Tokenizer(GGUFModel(path)).end_of_generation
    assert expected[0] not in stops and expected[1] in stops, (expected, stops)
    stopped = run_cli_in_process("generate", str(path), "--tokens", ",".join(map(str, PROMPT)), "--max-new", "3",
                                 "--backend", "emulator")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"{expected[0]},{expected[1]}"
    assert f"over 1 decode step; stopped at end-of-generation token {expected[1]}" in stopped.stderr
    ignored = run_cli_in_process("generate", str(path), "--tokens", ",".join(map(str, PROMPT)), "--max-new", "3",
                                 "--backend", "emulator", "--json", "--ignore-eos")
    assert ignored.returncode == 0, ignored.stderr
    summary = json.loads(ignored.stdout)
    assert summary["generated_tokens"] == expected and summary["stop"] == "max_new" and summary["decode_steps"] == 2
    assert summary["prompt_text"] is None, "--tokens: no text"


def test_text_standard_output_cannot_encode_is_replaced(files, monkeypatch):
    """--prompt's text on a standard output whose encoding lacks its characters (an ASCII locale):
    '?' for each, not a UnicodeEncodeError's traceback. The generation is stood in for: only the
    printing is tested."""
    import contextlib
    import io
    from unittest import mock

    from ptxgen.cli import main
    from ptxgen.generate import Generation

    tokens = Tokenizer(GGUFModel(files["qwen3"])).encode("grüße 你")
    monkeypatch.setattr(Generator, "generate", lambda self, prompt, max_new, keep_logits=False, stop_tokens=(): (
        Generation(prompt, tokens, None, len(tokens) - 1, 1.0, "max_new")))
    raw, stderr = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(raw, encoding="ascii")
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
            mock.patch.object(sys, "argv", ["ptxgen", "generate", str(files["qwen3"]), "--prompt", "hi", "--backend",
                                            "emulator", "--max-new", str(len(tokens))]):
        try:
            main()
        except SystemExit as exit:
            assert exit.code in (0, None), stderr.getvalue()
    stdout.flush()
    assert raw.getvalue() == b"gr??e ?\n", (raw.getvalue(), stderr.getvalue())


@pytest.mark.parametrize("file", ["sentencepiece", "short_vocab"])
def test_token_ids_work_whatever_the_tokenizer(files, file):
    """--tokens on a file whose tokenizer ptxgen does not read as text, or whose token list is
    shorter than the model's outputs: ids out, and --json's text null (not an error after the run)."""
    result = run_cli_in_process("generate", str(files[file]), "--tokens", "1,2", "--max-new", "1",
                                "--backend", "emulator", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["text"] is None and len(summary["generated_tokens"]) == 1


def test_the_prompt_is_required(files):
    result = run_cli_in_process("generate", str(files["qwen3"]), "--max-new", "1", "--backend", "emulator")
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip() == "error: give the prompt as --prompt TEXT or as --tokens IDS (one of them)"


# --- bad input -----------------------------------------------------------------------------------
def test_unsupported_weight_types_are_named(files):
    config = GGUFModel(files["mixed"]).config
    assert step_kernels(config, 16).fused_refusal is None
    split = dataclasses.replace(config, quants={**config.quants, "blk.1.ffn_up.weight": "q8_0"})
    assert step_kernels(split, 16).fused_refusal.startswith(
        "weight_quants: w_gate and w_up differ in layer(s) 1; the fused persistent_decoder computes a gate row and its "
        "up row in one warp task")
    with pytest.raises(PtxgenError, match=r"--fused: weight_quants: w_gate and w_up differ in layer\(s\) 1"):
        Generator(RandomModel(split), "emulator", max_seq_len=16, fused=True)
    f16 = dataclasses.replace(config, quants={**config.quants, "blk.1.ffn_up.weight": "f16"})
    with pytest.raises(PtxgenError, match=r"tensor 'blk\.1\.ffn_up\.weight' is F16; there is no GEMV kernel of that "
                                          r"type \(supported: Q4_K, Q6_K, Q8_0\)"):
        step_kernels(f16, 16)


@pytest.mark.parametrize("args, message", [
    (["{missing}"], r"missing\.gguf: cannot read GGUF file"),
    (["{text}"], r"not-a-model\.gguf: not a readable GGUF file"),
    (["{qwen3}", "--tokens", "1,x"], r"--tokens: expected comma-separated token ids \(e\.g\. 1,2,3\), got '1,x'"),
    (["{qwen3}", "--tokens", "1_0"], r"--tokens: expected comma-separated token ids \(e\.g\. 1,2,3\), got '1_0'"),
    (["{qwen3}", "--tokens", "+5"], r"--tokens: expected comma-separated token ids"),
    (["{qwen3}", "--tokens", "\u0661"], r"--tokens: expected comma-separated token ids"),  # an Arabic-Indic 1
    (["{qwen3}", "--max-seq-len", "0"], r"--max-seq-len: expected at least 1, got 0"),
    (["{qwen3}", "--tokens", "1,1000"], r"--tokens: token 1000 is outside the vocabulary \(0\.\.999\)"),
    (["{qwen3}", "--tokens", "-1"], r"token -1 is outside the vocabulary"),
    (["{qwen3}", "--max-seq-len", "4", "--max-new", "3"],
     r"--max-new 3: 3 prompt tokens and 3 new ones need 5 cache positions; the KV cache holds 4 \(--max-seq-len\)"),
    (["{qwen3}", "--tokens", "7", "--max-new", "300"],
     r"--max-new 300: 1 prompt token and 300 new ones need 300 cache positions; the KV cache holds 256 \(the "
     r"model's context_length; --max-seq-len sets it\)"),
    (["{qwen3}", "--max-new", "0"], r"--max-new: expected at least 1, got 0"),
    (["{qwen3}", "--tokens", "1,2,3,4,5", "--max-seq-len", "4", "--max-new", "1"],
     r"--tokens: 5 prompt tokens need 5 cache positions; the KV cache holds 4 \(--max-seq-len\)"),
    (["{qwen3}", "--tokens", "1,2,3", "--max-seq-len", "3", "--max-new", "2"],
     r"--max-new 2: 3 prompt tokens and 2 new ones need 4 cache positions"),
    (["{qwen3}", "--max-seq-len", "257"], r"--max-seq-len 257: above the model's context_length \(metadata "
                                          r"'qwen3\.context_length'\) = 256 \(positions it was never trained at; rope "
                                          r"scaling is not supported\)"),
    (["{long}", "--max-seq-len", "8388608"], r"no spec for this model \(--max-seq-len 8388608\): kernel "
                                              r"'tiny_qwen3_decoder' .*a layer's cache must be below 4 GiB"),
    (["{long}", "--max-seq-len", "16777217"], r"no spec for this model \(--max-seq-len 16777217\): kernel "
                                               r"'tiny_qwen3_decoder' .*max_seq_len: Input should be less than or equal "
                                               r"to 16777216"),
    (["{long}", "--max-seq-len", "16777217", "--separate"],
     r"\(--max-seq-len 16777217\): kernel 'tiny_qwen3_decoder' .*max_seq_len"),
    (["{split}", "--fused"], r"--fused: weight_quants: w_gate and w_up differ in layer\(s\) 0"),
    (["{nan_norm}"], r"tiny-qwen3: tensor 'output_norm\.weight' holds 1 NaN or infinite values"),
    (["{inf_scale}"], r"tiny-qwen3: tensor 'blk\.1\.attn_q\.weight' holds 1 NaN or infinite block scales"),
    (["{qwen3}", "--save-logits", "{folder}"], r"--save-logits .*: is a folder; give a file name"),
    (["{qwen3}", "--save-logits", "/dev/null"], r"--save-logits /dev/null: is not a regular file"),
    (["{qwen3}", "--save-logits", "{qwen3}"], r"--save-logits .*qwen3\.gguf: expected a \.npy file name"),
    # Checked before the model is read (a real one takes minutes to load and decode):
    (["{missing}", "--save-logits", "{folder}/sub/logits.npy"], r"--save-logits .*: the folder .*sub does not exist"),
    (["{qwen3}", "--prompt", "hi", "--tokens", "1"], r"give the prompt as --prompt TEXT or as --tokens IDS \(one of "
                                                     r"them\)"),
    (["{qwen3}", "--prompt", ""], r"--prompt: give at least one prompt token"),
    (["{qwen3}", "--prompt", "a b c d e", "--max-seq-len", "4"],  # a, Ġb, Ġc, Ġd, Ġ, e
     r"--prompt: 6 prompt tokens need 6 cache positions; the KV cache holds 4 \(--max-seq-len\)"),
    (["{sentencepiece}", "--prompt", "hi"], r"spm\.gguf: tokenizer\.ggml\.model = 'llama': ptxgen turns text into "
                                            r"tokens and back only for byte-level BPE"),
    (["{short_vocab}", "--prompt", "hi"], r"short\.gguf: the model outputs 1000 token ids, its tokenizer "
                                          r"\(tokenizer\.ggml\.tokens\) names 900"),
])
def test_bad_input_is_one_message_and_exit_2(files, tmp_path, args, message):
    (tmp_path / "not-a-model.gguf").write_text("hello")
    (tmp_path / "folder").mkdir()
    names = {"missing": tmp_path / "missing.gguf", "text": tmp_path / "not-a-model.gguf", "folder": tmp_path / "folder",
             **{name: files[name] for name in ("qwen3", "split", "nan_norm", "inf_scale", "long", "sentencepiece",
                                                 "short_vocab")}}
    args = [a.format(**names) for a in args]
    defaults = [option for name, value in (("--tokens", "1,2,3"), ("--max-new", "2"))
                if name not in args and not (name == "--tokens" and "--prompt" in args) for option in (name, value)]
    result = run_cli_in_process("generate", *args, *defaults, "--backend", "emulator")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "not-a-model.gguf"], "nothing written"


@pytest.mark.parametrize("flag", [None, "--separate", "--fused"])
def test_a_layer_matrix_without_a_gemv_kind_is_named_whichever_path(files, tmp_path, flag):
    """An F16 layer matrix gets the same one message by default as with --separate or --fused:
    the tensor, its type and the types there are GEMVs for (by default it had been the fused
    decoder's config refusal, 'its layers have no plan (persistent_decoder weight_quants.wq.1:
    Input should be ...)'; found by probing the model path)."""
    f16 = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float16) / 16
    model_path = rewrite_gguf(files["qwen3"], tmp_path / "f16-layer.gguf", drop_tensors=("blk.1.attn_q.weight",),
                              add_tensors=[("blk.1.attn_q.weight", f16, None)])
    result = run_cli_in_process("generate", str(model_path), "--tokens", "1", "--max-new", "1", "--backend", "emulator",
                                *([flag] if flag else []))
    assert result.returncode == 2 and not result.stdout, result
    assert result.stderr.strip().splitlines() == [
        "error: tiny-qwen3: tensor 'blk.1.attn_q.weight' is F16; there is no GEMV kernel of that type "
        "(supported: Q4_K, Q6_K, Q8_0)"], result.stderr


def test_a_model_no_path_can_take_is_one_error_without_a_note(tmp_path, monkeypatch):
    """Q8_0 layers of intermediate 288 (9 Q8_0 blocks: a legal row, but not the 64-weight
    multiple q8_0_gemv takes, nor the fused decoder's 256): the one error naming the kernel,
    not first a note that the layers run as separate kernels (which they then did not)."""
    from fixtures import make_tiny_gguf

    monkeypatch.setitem(make_tiny_gguf.SHAPE, "intermediate", 288)
    model_path = write_tiny_gguf(tmp_path / "ffn288.gguf", quant="q8_0")
    for flag in ([], ["--separate"]):
        result = run_cli_in_process("generate", str(model_path), "--tokens", "1", "--max-new", "1", "--backend",
                                    "emulator", *flag)
        assert result.returncode == 2 and not result.stdout, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and re.fullmatch(r"error: tiny-qwen3: no spec for this model: kernel "
                                                r"'tiny_qwen3_q8_0_gemv_256x288' .*k: expected a multiple of 64 .*got 288",
                                                lines[0]), result.stderr


def test_save_logits_never_replaces_the_model(files, tmp_path):
    model = tmp_path / "model.npy"  # a model file that happens to carry the output's suffix
    model.write_bytes(files["qwen3"].read_bytes())
    result = run_cli_in_process("generate", str(model), "--tokens", "1", "--max-new", "1", "--backend", "emulator",
                                "--save-logits", str(model))
    assert result.returncode == 2 and f"--save-logits {model}: is the input file" in result.stderr, result
    assert model.read_bytes() == files["qwen3"].read_bytes()


# --- whole-model decode speed (make bench's rows), on the simulated GPU ------------------------------
def test_q4_k_m_types_follow_llama_cpps_rule():
    """Qwen3-8B's 36 layers: attn_v and ffn_down Q6_K in layers 0-3, 31-35 and 6, 9, ..., 30
    (llama.cpp's use_more_bits with C's integer division), output.weight Q6_K, the rest Q4_K."""
    types = q4_k_m_types(QWEN3_8B)
    more = [l for l in range(36) if types[f"blk.{l}.attn_v.weight"] == "q6_k"]
    assert more == [0, 1, 2, 3, *range(6, 31, 3), 31, 32, 33, 34, 35]
    assert all(types[f"blk.{l}.ffn_down.weight"] == types[f"blk.{l}.attn_v.weight"] for l in range(36))
    assert types["output.weight"] == "q6_k" and types["token_embd.weight"] == "q4_k"
    assert {types[f"blk.{l}.{s}.weight"] for l in range(36) for s in ("attn_q", "attn_k", "attn_output", "ffn_gate",
                                                                      "ffn_up")} == {"q4_k"}
    ModelConfig(**QWEN3_8B, quants=types)  # every matrix typed


def test_decode_speed_on_the_simulated_gpu(files, simulated):
    """The rates make bench reports, for the mixed fixture through the separate kernels: both
    positive."""
    model = GGUFModel(files["mixed"])
    generator = Generator(model, "device", max_seq_len=16)
    kernels = [call.kernel for call in generator.layer_calls(0) + generator.head_calls()]
    simulated.kernels.update({k.name: k for k in kernels})
    rates = decode_speed(generator, 5, 3)
    assert set(rates) == {"tokens_per_s", "layers_tokens_per_s"} and min(rates.values()) > 0
    generator.close()


# --- an implementation nobody here wrote: transformers' GGUF loader ---------------------------------
# Both sides dequantise the same blocks (transformers through gguf-py, to f32) and run the model
# without quantising activations: transformers in f32 (on the CPU), the reference in float64.
# Measured with transformers 5.23 / torch 2.13 (CPU): relative L2 4.3-5.1e-7 at every position of
# both fixtures, the f32 rounding of two layers of <= 512-term dot products. Allowed: 1e-5, about
# 20x that; a wrong rope pairing, a missing Q/K norm or a transposed matrix moves logits by far more.
TRANSFORMERS_TOL = 1e-5


@pytest.mark.parametrize("arch", ["mixed", "llama"], ids=["qwen3-q4_k_m-mixed", "llama"])
def test_transformers_gguf_loader_gives_the_references_logits(files, arch):
    """Where transformers is installed (the GPU machines): the fixture loaded by its GGUF loader
    (head_dim passed: 128 is not hidden / heads = 64) and the float64 reference agree at every
    position of a prompt; so does what ptxgen generate computes, by the tests above."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = files[arch]
    model = GGUFModel(path)
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               head_dim=model.config.head_dim, torch_dtype=torch.float32)
    except ValueError as error:  # no GGUF loader for the architecture, or a missing extra (accelerate)
        pytest.skip(f"transformers {transformers.__version__} cannot load this {model.config.architecture} GGUF: "
                    f"{error}")
    tokens = [5, 999, 17, 256]
    with torch.no_grad():
        theirs = hf(torch.tensor([tokens])).logits[0].double().numpy()
    ours = ReferenceModel(model).run(tokens)
    for pos in range(len(tokens)):
        error = relative_l2(theirs[pos], ours[pos])
        assert error <= TRANSFORMERS_TOL, f"{arch} position {pos}: transformers' logits {error:.2e} from the reference"


# --- on a real GPU (pytest -m gpu) ----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("arch, fused", [("mixed", False), ("llama", True), ("qwen3", True)],
                         ids=["q4_k_m-mixed-separate", "llama-fused", "qwen3-fused"])
def test_generate_on_the_gpu_matches_the_references(files, arch, fused):
    """The device path for real: the same tokens as both float64 references, logits within 2E."""
    try:
        device.driver()
    except DeviceUnavailable:
        pytest.skip("no CUDA driver/GPU on this machine")
    model = GGUFModel(files[arch])
    generator = Generator(model, "device", max_seq_len=16, fused=fused)
    try:
        result = generator.generate(PROMPT, MAX_NEW, keep_logits=True)
    finally:
        generator.close()
    check_against_references(model, PROMPT, result.tokens, result.logits)


def test_random_model_decode_speed_runs_make_bench_s_path(simulated):
    """make bench's whole-model call (the worker runs exactly this) on the simulated GPU, for the
    tiny shapes: Q4_K_M-like types through the separate kernels and fused. The simulation spends
    4 us a kernel and nothing on an event: the step at pos is its launches x 4 us, the head its
    three (norm, lm_head, argmax); with a Q4_K lm_head the head is a q4k_gemv."""
    shape = {key: value for key, value in dataclasses.asdict(tiny_config()).items() if key != "quants"}
    tokens, pos = 2, 200
    for fused, lm_head in WHOLE_MODEL_PATHS:
        quants = {**q4_k_m_types(shape), **({"output.weight": lm_head} if lm_head else {})}
        kernels = step_kernels(ModelConfig(**shape, quants=quants), pos + 1)
        configs = [kernels.norm, kernels.lm_head, kernels.argmax, kernels.decoder]
        assert kernels.lm_head.kind == ("q4k_gemv" if lm_head == "q4_k" else "q6k_gemv")
        layers = [call.kernel for call in kind_of(kernels.decoder).separate_step({"pos": 0}, kernels.prefix)[1]]
        simulated.kernels.update({config.name: config for config in configs + layers})
        row = random_model_decode_speed(shape, fused, tokens, pos=pos, lm_head=lm_head)
        assert row["lm_head"] == (lm_head or "q6_k").upper()
        assert row["layers"] == ("persistent_decoder" if fused else "separate kernels") and row["tokens"] == tokens
        assert row["tokens_per_s"] > 0 and row["layers_tokens_per_s"] > 0 and row["device"] == "Simulated GPU"
        launches = 1 if fused else len(layers)
        assert row["pos"] == pos and not row["host_bound"], row
        assert row["layers_us"] == pytest.approx(4.0 * launches) and row["head_us"] == pytest.approx(12.0), row
        assert row["step_us"] == pytest.approx(4.0 * (launches + 3)), row
    with pytest.raises(PtxgenError, match="pos 256 do not fit tiny-qwen3's context of 256 positions"):
        random_model_decode_speed(shape, False, tokens, pos=256)
    with pytest.raises(PtxgenError, match="lm_head 'q5_k': expected one of q4_k, q6_k, q8_0"):
        random_model_decode_speed(shape, False, tokens, pos=pos, lm_head="q5_k")


def test_random_model_with_layers_alike_makes_each_matrix_type_once():
    """The benchmark's 36 layers in seconds: every layer's matrix of a name and type holds the
    first such layer's values (the same bytes the distinct model gives that layer), made once."""
    shape = {key: value for key, value in dataclasses.asdict(tiny_config()).items() if key != "quants"}
    shape["num_layers"] = 8
    config = ModelConfig(**shape, quants=q4_k_m_types(shape))
    types = {l: config.quants[f"blk.{l}.attn_v.weight"] for l in range(8)}
    assert [l for l in types if types[l] == "q6_k"] == [0, 3, 6, 7], types
    alike, distinct = RandomModel(config, 5, distinct_layers=False), RandomModel(config, 5)
    for l in range(8):
        first = min(m for m in range(8) if types[m] == types[l])
        got = alike.tensor_bytes(f"blk.{l}.attn_v.weight")
        assert np.array_equal(got, distinct.tensor_bytes(f"blk.{first}.attn_v.weight")), l
        assert got is alike.tensor_bytes(f"blk.{first}.attn_v.weight"), "made once, then kept"
    assert not np.array_equal(distinct.tensor_bytes("blk.2.attn_v.weight"), distinct.tensor_bytes("blk.0.attn_v.weight"))
    q6_head, q4_head = random_model(shape, 5), random_model(shape, 5, "q4_k")  # the benchmark's two heads
    assert q6_head.tensor_bytes("blk.1.ffn_up.weight") is q4_head.tensor_bytes("blk.1.ffn_up.weight"), "layers shared"
    assert (q6_head.config.lm_head.quant, q4_head.config.lm_head.quant) == ("q6_k", "q4_k")
    assert q4_head.tensor_bytes("output.weight").shape[1] == quant_type("q4_k").row_bytes(shape["hidden"])