"""Tokenizers and chat templates of Hugging Face model directories, without transformers.

`ChatTokenizer` loads `tokenizer.json` with the `tokenizers` library and renders the chat template
(`tokenizer_config.json["chat_template"]` or `chat_template.jinja`) with jinja2 the way
transformers does (sandboxed, trim_blocks, lstrip_blocks, `raise_exception`, `tojson`). Prompts are
rendered with `add_generation_prompt=True` and `enable_thinking=False` (z-lab's drafters were trained
without thinking traces), then encoded without adding special tokens (the template has them).

Knows nothing of models, suites or HTTP.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError


def _raise(message: str) -> None:
    raise UsageError(f"chat template: {message}")


@lru_cache(maxsize=32)
def _compile(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise UsageError(f"chat template does not parse: {e}") from None


class ChatTokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        tok_path = model_dir / "tokenizer.json"
        if not tok_path.exists():
            raise UsageError(f"{model_dir} has no tokenizer.json")
        try:
            self.tok = Tokenizer.from_file(str(tok_path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise UsageError(f"{tok_path}: cannot load tokenizer ({e})") from None
        cfg_path = model_dir / "tokenizer_config.json"
        cfg: dict[str, Any] = {}
        if cfg_path.exists():
            try:
                cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise UsageError(f"{cfg_path}: malformed JSON ({e})") from None
        template = cfg.get("chat_template")
        jinja_file = model_dir / "chat_template.jinja"
        if template is None and jinja_file.exists():
            template = jinja_file.read_text(encoding="utf-8")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        self.chat_template: str | None = template
        self.special = {k: cfg.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        for k, v in list(self.special.items()):
            if isinstance(v, dict):  # AddedToken serialisation
                self.special[k] = v.get("content")
        self.model_dir = model_dir

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        eos = self.special.get("eos_token")
        return self.token_id(eos) if eos else None

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True, enable_thinking: bool = False) -> str:
        if not self.chat_template:
            raise UsageError(f"{self.model_dir} has no chat template; use a suite of raw prompts or --endpoint completions")
        return _compile(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            tools=None,
            **{k: (v or "") for k, v in self.special.items()},
        )

    def apply_chat_template(self, messages: list[dict[str, str]], enable_thinking: bool = False) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True, enable_thinking=enable_thinking))


def generation_stop_ids(model_dir: str | Path, tokenizer: ChatTokenizer | None = None) -> list[int]:
    """Default stop ids: generation_config.json's eos_token_id (int or list), else config.json's,
    else the tokenizer's eos token."""
    model_dir = Path(model_dir)
    for name in ("generation_config.json", "config.json"):
        p = model_dir / name
        if p.exists():
            try:
                eos = json.loads(p.read_text(encoding="utf-8")).get("eos_token_id")
            except json.JSONDecodeError:
                eos = None
            if eos is not None:
                return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return [tokenizer.eos_token_id]
    return []
