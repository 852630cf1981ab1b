"""The chat template a GGUF file carries (tokenizer.chat_template: the Jinja text of Hugging Face's
tokenizer_config.json), rendered for `ptxgen generate --chat` as transformers' apply_chat_template
renders it: jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension, a `tojson` filter that keeps non-ASCII text, the `raise_exception` and
`strftime_now` globals, and `messages`, `tools` (None), `documents` (None),
`add_generation_prompt` (true), `bos_token` and `eos_token` (the tokens' texts, "" where the file
names none, as llama.cpp) as variables; `enable_thinking` only where asked for.

BOS, as llama.cpp: where the tokenizer adds the BOS token itself (add_bos_token), a BOS text the
template writes first is cut off the rendered text, so the prompt starts with one BOS, not two
(transformers gets the same tokens by encoding the rendered text without adding specials).
"""

from __future__ import annotations

import json
from datetime import datetime

from .errors import PtxgenError


def chat_prompt(model, tokenizer, user: str, system: str | None = None, thinking: bool | None = None) -> str:
    """The text of a chat of `user`'s message (after `system`'s) with the assistant's turn opened,
    from `model`'s chat template, for `tokenizer`.encode; `thinking` sets enable_thinking (None:
    the template's default)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Sandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj, attribute):
            # jinja2 renders an unsafe attribute as an empty Undefined: here it stops the rendering.
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is unsafe")

    source = model.metadata("tokenizer.chat_template", None)
    if source is None:
        raise PtxgenError(f"{model.path}: the file has no chat template (tokenizer.chat_template); give the prompt "
                          "without --chat, in the model's chat format")
    if not isinstance(source, str):
        raise PtxgenError(f"{model.path}: tokenizer.chat_template must be str, got {type(source).__name__}")
    variables = {"messages": ([{"role": "system", "content": system}] if system is not None else [])
                 + [{"role": "user", "content": user}],
                 "tools": None, "documents": None, "add_generation_prompt": True,
                 "bos_token": _token_text(model, tokenizer, "bos"), "eos_token": _token_text(model, tokenizer, "eos")}
    if thinking is not None:
        if "enable_thinking" not in source:
            raise PtxgenError(f"{model.path}: --{'' if thinking else 'no-'}think: the chat template does not read "
                              "enable_thinking")
        variables["enable_thinking"] = thinking

    def raise_exception(message):
        raise jinja2.TemplateError(f"raise_exception({message!r})")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception,
                               strftime_now=lambda format: datetime.now().strftime(format))
    try:
        text = environment.from_string(source).render(variables)
    except jinja2.TemplateSyntaxError as error:
        raise PtxgenError(f"{model.path}: tokenizer.chat_template line {error.lineno}: {error.message}") from None
    except Exception as error:  # the template is the file's code: whatever it raises is the file's error
        raise PtxgenError(f"{model.path}: tokenizer.chat_template does not render: "
                          f"{type(error).__name__}: {error}") from None
    bos = variables["bos_token"]
    if tokenizer.adds_bos and bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def _token_text(model, tokenizer, name: str) -> str:
    """The text of the token tokenizer.ggml.`name`_token_id names ("" where it names none)."""
    token = model.metadata(f"tokenizer.ggml.{name}_token_id", None)
    return tokenizer.tokens[token] if isinstance(token, int) and 0 <= token < len(tokenizer.tokens) else ""
