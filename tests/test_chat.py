"""ptxgen.chat and `generate --chat` on the tiny fixtures' chat templates (tests/fixtures/make_tiny_gguf.py:
ChatML as Qwen3's, Llama 3's header format): the exact text a user (and system) message renders to,
one BOS, enable_thinking, and every failure of a template (its own raise_exception, an undefined
name, a sandbox violation, a syntax error) as one PtxgenError naming the file."""

from __future__ import annotations

import json
import re

import gguf
import pytest
from fixtures.make_tiny_gguf import ARCH, rewrite_gguf, write_tiny_gguf

from ptxgen.chat import chat_prompt
from ptxgen.errors import PtxgenError
from ptxgen.gguf_model import GGUFModel
from ptxgen.tokenizer import Tokenizer

from helpers import run_cli_in_process

# The texts Hugging Face's apply_chat_template gives for the fixtures' templates, written out; Llama
# 3's without its BOS text, which the tokenizer adds (add_bos_token).
EXPECTED = {
    ("qwen3", None): "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    ("qwen3", "Be brief."): "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                            "<|im_start|>assistant\n",
    ("llama", None): "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ("llama", "Be brief."): "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                            "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\n",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    files = {arch: write_tiny_gguf(root / f"{arch}.gguf", arch, quant="q4_k") for arch in ARCH}
    files["plain"] = rewrite_gguf(files["qwen3"], root / "plain.gguf", drop_fields=("tokenizer.chat_template",))
    # Llama 3 with add_bos_token false: the template's BOS text is the one BOS
    files["llama-no-add-bos"] = rewrite_gguf(files["llama"], root / "llama-no-add-bos.gguf",
                                             drop_fields=("tokenizer.ggml.add_bos_token",),
                                             set_fields=[("tokenizer.ggml.add_bos_token", False,
                                                          gguf.GGUFValueType.BOOL)])
    return files


def rendered(path, system=None, thinking=None, user="hi there") -> tuple[str, list[int], Tokenizer]:
    model = GGUFModel(path)
    tokenizer = Tokenizer(model)
    text = chat_prompt(model, tokenizer, user, system, thinking)
    return text, tokenizer.encode(text), tokenizer


@pytest.mark.parametrize("arch, system", list(EXPECTED))
def test_a_message_renders_as_the_models_chat_format(files, arch, system):
    text, ids, tokenizer = rendered(files[arch], system)
    assert text == EXPECTED[arch, system]
    if arch == "llama":  # the template writes {{ bos_token }}, the tokenizer adds BOS: one of them
        bos = tokenizer.tokens.index("<|begin_of_text|>")
        assert ids[0] == bos and ids.count(bos) == 1, ids
    header = "<|start_header_id|>" if arch == "llama" else "<|im_start|>"
    assert ids.count(tokenizer.tokens.index(header)) == (3 if system else 2), "special tokens matched literally"


def test_the_templates_bos_is_kept_where_the_tokenizer_adds_none(files):
    """add_bos_token false: the BOS text the template writes is the prompt's one BOS (as llama.cpp,
    which cuts it only where the tokenizer adds its own)."""
    text, ids, tokenizer = rendered(files["llama-no-add-bos"])
    assert text == "<|begin_of_text|>" + EXPECTED["llama", None]
    bos = tokenizer.tokens.index("<|begin_of_text|>")
    assert ids[0] == bos and ids.count(bos) == 1


def test_thinking_sets_enable_thinking(files):
    assert rendered(files["qwen3"], thinking=True)[0] == EXPECTED["qwen3", None], "the template's default: thinking"
    text, ids, tokenizer = rendered(files["qwen3"], thinking=False)
    assert text == EXPECTED["qwen3", None] + "<think>\n\n</think>\n\n"
    assert tokenizer.tokens.index("</think>") in ids
    with pytest.raises(PtxgenError, match=r"llama\.gguf: --no-think: the chat template does not read enable_thinking"):
        rendered(files["llama"], thinking=False)


class WithTemplate:
    """A fixture model whose tokenizer.chat_template is `template`."""

    def __init__(self, model: GGUFModel, template):
        self.model, self.template, self.path = model, template, model.path

    def metadata(self, key, *default):
        return self.template if key == "tokenizer.chat_template" else self.model.metadata(key, *default)


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('System role not supported') }}",
     r"does not render: TemplateError: raise_exception\('System role not supported'\)"),
    ("{{ nothing.attribute }}", r"does not render: UndefinedError: 'nothing' is undefined"),
    ("{{ messages[0].content.missing.deeper }}", r"UndefinedError: 'str object' has no attribute 'missing'"),
    ("{% for m in messages %}{{ m.content }}", r"tokenizer\.chat_template line 1: Unexpected end of template"),
    ("{{ 'x' | no_such_filter }}", r"line 1: No filter named 'no_such_filter'"),
    # the sandbox: no private attributes, no file, no change to the arguments
    ("{{ ''.__class__.__mro__ }}", r"SecurityError: access to attribute '__class__' of a str is unsafe"),
    ("{{ ''.__class__ }}", r"SecurityError: access to attribute '__class__' of a str is unsafe"),
    ("{{ cycler.__init__.__globals__ }}", r"SecurityError: access to attribute '__init__' of a type is unsafe"),
    ("{{ raise_exception.__globals__ }}", r"SecurityError: access to attribute '__globals__' of a function is unsafe"),
    ("{{ messages.append(1) }}", r"SecurityError: access to attribute 'append' of a list is unsafe"),
    ("{% include '/etc/passwd' %}", r"TypeError: no loader for this environment specified"),
    ("{{ 1 / 0 }}", r"ZeroDivisionError: division by zero"),
    (7, r"tokenizer\.chat_template must be str, got int"),
])
def test_a_template_that_fails_is_one_error_naming_the_file(files, template, message):
    model = GGUFModel(files["qwen3"])
    with pytest.raises(PtxgenError, match=r"^.*qwen3\.gguf: ") as caught:
        chat_prompt(WithTemplate(model, template), Tokenizer(model), "hi")
    assert re.search(message, str(caught.value)), caught.value
    assert "\n" not in str(caught.value)


def test_a_file_without_a_chat_template_is_one_error(files):
    with pytest.raises(PtxgenError, match=r"plain\.gguf: the file has no chat template \(tokenizer\.chat_template\); "
                                          r"give the prompt without --chat"):
        rendered(files["plain"])


def test_the_tojson_filter_keeps_text_and_strftime_now_is_a_global(files):
    """As transformers': tojson does not escape non-ASCII or HTML characters."""
    model = GGUFModel(files["qwen3"])
    template = "{{ messages | tojson }}|{{ strftime_now('%Y') | length }}{% for m in messages %}{% break %}{% endfor %}"
    text = chat_prompt(WithTemplate(model, template), Tokenizer(model), "grüße <b>")
    assert text == '[{"role": "user", "content": "grüße <b>"}]|4'


# --- the command line ---------------------------------------------------------------------------------
def test_generate_chat_encodes_the_rendered_prompt(files):
    """--chat --json: prompt_text is the rendered template, prompt_tokens its encoding."""
    result = run_cli_in_process("generate", str(files["qwen3"]), "--chat", "--prompt", "hi there", "--system",
                                "Be brief.", "--no-think", "--backend", "emulator", "--max-new", "1", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    text, ids, _ = rendered(files["qwen3"], "Be brief.", thinking=False)
    assert summary["prompt_text"] == text == EXPECTED["qwen3", "Be brief."] + "<think>\n\n</think>\n\n"
    assert summary["prompt_tokens"] == ids
    assert len(summary["generated_tokens"]) == 1


@pytest.mark.parametrize("args, message", [
    (["{qwen3}", "--chat", "--tokens", "1,2"], r"--chat: give the user's message as --prompt TEXT"),
    (["{qwen3}", "--prompt", "hi", "--system", "Be brief."], r"--system is a chat setting: give it with --chat"),
    (["{qwen3}", "--prompt", "hi", "--no-think"], r"--no-think is a chat setting: give it with --chat"),
    (["{plain}", "--chat", "--prompt", "hi"], r"plain\.gguf: the file has no chat template"),
    (["{llama}", "--chat", "--prompt", "hi", "--think"], r"llama\.gguf: --think: the chat template does not read "
                                                         r"enable_thinking"),
])
def test_bad_chat_options_are_one_message_and_exit_2(files, args, message):
    result = run_cli_in_process("generate", *[a.format(**files) for a in args], "--backend", "emulator")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), result.stderr
    assert not result.stdout
