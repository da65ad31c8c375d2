"""One suite definition (`suites/<name>.yaml`): its schema, validation, and user-turn templates.

A suite YAML names where the items come from (`source`: a bundled/local JSONL file, or a Hugging
Face dataset; or `mix`: parts of other suites), how many items a run uses by default (`n`), which
subset rule picks them (`subset`, see `subsets.py`), and how one raw item becomes the user turns
of a conversation (`turns`: Jinja2 templates over the item's fields, one per turn; or
`turns_from`: a field that already holds the list of turns). Unknown keys are errors that name the
file and the key. See `docs/suites.md` for the format.

Templates are rendered by a sandboxed Jinja2 environment with StrictUndefined (a missing field is
an error, never an empty string) and `keep_trailing_newline`, so a template renders to exactly
the characters written in the YAML.
Knows nothing of where suite files are looked up, of datasets libraries, or of models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.suites.subsets import RULES

TOP_KEYS = ("name", "description", "source", "mix", "n", "subset", "id_field", "category_field",
            "turns", "turns_from", "reference", "notes")
SOURCE_KEYS = ("file", "hf", "config", "split", "data_files", "origin", "license", "equivalent", "size")
MIX_KEYS = ("suite", "n", "category")


@dataclass
class Source:
    """Where a suite's raw items come from: exactly one of `file` (JSONL) or `hf` (dataset id)."""

    file: str | None = None            # bundled (ddtree_bench/data/) or relative to the YAML file
    hf: str | None = None              # Hugging Face dataset id, loaded through `datasets`
    config: str | None = None          # HF config name (e.g. "main", "sanitized")
    split: str | None = None
    data_files: list[str] | None = None  # files of the HF dataset repo, loaded with the json builder
    origin: str | None = None          # provenance, free text
    license: str | None = None
    equivalent: str | None = None      # for bundled copies: the HF dataset they correspond to
    size: int | None = None            # number of items in the source (documentation)

    @property
    def offline(self) -> bool:
        return self.file is not None

    def describe(self) -> str:
        if self.file is not None:
            return f"bundled {self.file}" if "/" not in self.file else f"file {self.file}"
        s = f"hf {self.hf}"
        if self.config:
            s += f" ({self.config})"
        if self.data_files:
            s += f" files {','.join(self.data_files)}"
        return s + f" split {self.split}"


@dataclass
class MixPart:
    suite: str
    n: int
    category: str


@dataclass
class SuiteSpec:
    name: str
    path: Path
    description: str = ""
    source: Source | None = None
    mix: list[MixPart] | None = None
    n: int | None = None               # default sample count; None = every item
    subset: str | None = "zlab-paper"
    id_field: str | None = None        # None (or a missing field): the item's 0-based source index
    category_field: str | None = None
    turns: list[str] | None = None     # Jinja2 templates, one per user turn
    turns_from: str | None = None      # field holding the list of user turns, used verbatim
    reference: str | None = None
    notes: str | None = None
    _compiled: list[Any] = field(default_factory=list, repr=False)

    def template_text(self) -> str:
        """The template as recorded in run.json / baselines: exact text, JSON list if several turns."""
        if self.mix is not None:
            return "mix: " + ", ".join(f"{p.suite} x{p.n} ({p.category})" for p in self.mix)
        if self.turns_from is not None:
            return f"turns verbatim from field {self.turns_from!r}"
        assert self.turns is not None
        if len(self.turns) == 1:
            return self.turns[0]
        import json

        return json.dumps(self.turns, ensure_ascii=False)

    def render(self, item: dict[str, Any], where: str = "item") -> list[str]:
        """The user turns for one raw item. Raises UsageError naming the suite, item and field."""
        if self.mix is not None:
            raise UsageError(f"suite {self.name!r} is a mix of other suites and has no single template",
                             hint=f"use one of its parts: {', '.join(p.suite for p in self.mix)}")
        if not isinstance(item, dict):
            raise UsageError(f"suite {self.name!r}: {where} is not an object")
        if self.turns_from is not None:
            turns = item.get(self.turns_from)
            if not isinstance(turns, (list, tuple)) or not turns or not all(isinstance(t, str) for t in turns):
                raise UsageError(f"suite {self.name!r}: {where} field {self.turns_from!r} must be a non-empty list of strings")
            out = list(turns)
        else:
            import jinja2

            out = []
            for t, tmpl in enumerate(self._templates()):
                try:
                    out.append(tmpl.render(**item))
                except jinja2.UndefinedError as e:
                    fields = ", ".join(sorted(map(str, item))) or "none"
                    raise UsageError(f"suite {self.name!r}: turn {t} template needs a field that {where} lacks ({e.message}); "
                                     f"its fields: {fields}") from None
                except (jinja2.TemplateError, ArithmeticError, ValueError, TypeError, MemoryError) as e:
                    # the sandbox's own limits (range(10**9) is an OverflowError) and a template's runtime errors
                    raise UsageError(f"suite {self.name!r}: turn {t} template failed on {where}: "
                                     f"{type(e).__name__}: {e}") from None
        for t, text in enumerate(out):
            if not text.strip():
                raise UsageError(f"suite {self.name!r}: turn {t} of {where} renders to an empty string")
        return out

    def item_id(self, item: dict[str, Any], index: int) -> str:
        if self.id_field is not None and item.get(self.id_field) is not None:
            return str(item[self.id_field])
        return str(index)

    def _templates(self) -> list[Any]:
        if not self._compiled:
            env = _jinja_env()
            self._compiled = [env.from_string(t) for t in self.turns or []]
        return self._compiled


def _jinja_env() -> Any:
    import jinja2
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


def _unknown(path: Path, obj: dict[str, Any], allowed: tuple[str, ...], prefix: str = "") -> None:
    for k in obj:
        if k not in allowed:
            raise UsageError(f"{path}: unknown key {prefix + str(k)!r}", hint=f"allowed keys{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(allowed)}")


def _opt_str(path: Path, obj: dict[str, Any], key: str, prefix: str = "") -> str | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise UsageError(f"{path}: {prefix + key!r} must be a string, got {type(v).__name__}")
    return v


def _opt_count(path: Path, v: Any, key: str, allow_none: bool = True) -> int | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise UsageError(f"{path}: {key!r} must be a positive integer{' or null' if allow_none else ''}, got {v!r}")
    return v


def parse_spec(path: Path, data: Any) -> SuiteSpec:
    """Validate a loaded YAML document into a SuiteSpec. Every problem is a UsageError naming `path`."""
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a suite file must be a YAML mapping, got {type(data).__name__}")
    _unknown(path, data, TOP_KEYS)
    name = data.get("name", path.stem)
    if name != path.stem:
        raise UsageError(f"{path}: 'name' is {name!r} but the file is named {path.stem!r}; they must match")
    spec = SuiteSpec(name=name, path=path)
    spec.description = _opt_str(path, data, "description") or ""
    spec.reference = _opt_str(path, data, "reference")
    spec.notes = _opt_str(path, data, "notes")
    spec.n = _opt_count(path, data.get("n"), "n")
    spec.subset = data.get("subset", "zlab-paper")
    if spec.subset is not None and spec.subset not in RULES:
        raise UsageError(f"{path}: unknown subset rule {spec.subset!r}; expected one of {', '.join(RULES)}")

    has_source, has_mix = "source" in data, "mix" in data
    if has_source == has_mix:
        raise UsageError(f"{path}: give exactly one of 'source' and 'mix'")
    if has_mix:
        for k in ("turns", "turns_from", "id_field", "category_field"):
            if k in data:
                raise UsageError(f"{path}: {k!r} does not apply to a mix (each part uses its own suite's)")
        parts = data["mix"]
        if not isinstance(parts, list) or not parts:
            raise UsageError(f"{path}: 'mix' must be a non-empty list of {{suite, n, category}}")
        spec.mix = []
        for i, p in enumerate(parts):
            if not isinstance(p, dict):
                raise UsageError(f"{path}: mix[{i}] must be a mapping with suite, n, category")
            _unknown(path, p, MIX_KEYS, f"mix[{i}].")
            suite = _opt_str(path, p, "suite", f"mix[{i}].")
            if not suite:
                raise UsageError(f"{path}: mix[{i}] needs 'suite'")
            n = _opt_count(path, p.get("n"), f"mix[{i}].n", allow_none=False)
            spec.mix.append(MixPart(suite=suite, n=n, category=_opt_str(path, p, "category", f"mix[{i}].") or suite))
        return spec

    src = data["source"]
    if not isinstance(src, dict):
        raise UsageError(f"{path}: 'source' must be a mapping (file: ..., or hf: ... with split: ...)")
    _unknown(path, src, SOURCE_KEYS, "source.")
    s = Source(**{k: src.get(k) for k in SOURCE_KEYS})
    for k in ("file", "hf", "config", "split", "origin", "license", "equivalent"):
        _opt_str(path, src, k, "source.")
    if (s.file is None) == (s.hf is None):
        raise UsageError(f"{path}: 'source' needs exactly one of 'file' (a JSONL file) and 'hf' (a Hugging Face dataset id)")
    if s.hf is not None and not s.split:
        raise UsageError(f"{path}: 'source.split' is required with 'source.hf'")
    if s.data_files is not None:
        if s.hf is None or not isinstance(s.data_files, list) or not s.data_files or not all(isinstance(f, str) for f in s.data_files):
            raise UsageError(f"{path}: 'source.data_files' must be a non-empty list of file names, with 'source.hf'")
    s.size = _opt_count(path, s.size, "source.size")
    spec.source = s

    spec.id_field = _opt_str(path, data, "id_field")
    spec.category_field = _opt_str(path, data, "category_field")
    has_turns, has_from = "turns" in data, "turns_from" in data
    if has_turns == has_from:
        raise UsageError(f"{path}: give exactly one of 'turns' (templates) and 'turns_from' (a field with the turns)")
    if has_from:
        spec.turns_from = _opt_str(path, data, "turns_from")
        if not spec.turns_from:
            raise UsageError(f"{path}: 'turns_from' must name a field")
    else:
        turns = data["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise UsageError(f"{path}: 'turns' must be a non-empty list of template strings, one per user turn")
        spec.turns = list(turns)
        import jinja2

        try:
            spec._templates()
        except jinja2.TemplateSyntaxError as e:
            raise UsageError(f"{path}: template syntax error in 'turns' (line {e.lineno} of the template): {e.message}") from None
    return spec


def load_spec_file(path: Path) -> SuiteSpec:
    """Read and validate one suite YAML file."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"suite file {path}: not UTF-8 text (a binary file?) at byte {e.start}") from None
    except OSError as e:
        raise UsageError(f"cannot read suite file {path}: {e.strerror or e}") from None
    from ddtree_bench.yaml_mapping import unique_keys_loader

    try:
        data = yaml.load(text, Loader=unique_keys_loader())   # a key given twice is refused, as in grid and rules files
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{path}{where}: malformed YAML ({problem})") from None
    return parse_spec(path, data)
