"""The toy pair's offline training corpus, as byte-token streams.

Three sources, all disjoint from the evaluation suites (GSM8K *test*, HumanEval, MT-Bench are never
read here):
* code     - the Python standard library that ships with the running interpreter (`.py` files,
             site-packages excluded), plus "write this function" chats built from stdlib functions
             with docstrings (the user turn uses the humaneval suite's template; the function
             itself is stdlib code, not a HumanEval problem);
* gsm8k    - GSM8K *train* (bundled, gzipped) as ChatML chats with the gsm8k suite's exact user-turn
             template; answers keep the worked steps, drop the `<<calc>>` annotations and end with
             `\\boxed{answer}`;
* chat     - the ShareGPT sample as ChatML chats (note: the `sharegpt` suite draws on the same
             sample, so it is not held out; the paper's suites are).
Documents are joined with <|endoftext|>. Knows the toy tokenizer and the suites' templates; nothing
of models.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddtree_bench.toy.tokenizer import ENDOFTEXT, IM_END, IM_START

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GSM8K_TRAIN = "gsm8k_train.jsonl.gz"
SHAREGPT = "sharegpt_sample500.jsonl"
MAX_FILE_BYTES = 200_000


def encode_text(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_tokens(turns: list[tuple[str, str]]) -> list[int]:
    """ChatML: <|im_start|>role\\ncontent<|im_end|>\\n per turn (the toy chat template, tokenised)."""
    out: list[int] = []
    for role, content in turns:
        out += [IM_START] + encode_text(f"{role}\n{content}") + [IM_END] + encode_text("\n")
    return out


def gsm8k_answer(answer: str) -> str:
    """GSM8K's worked answer with calculator annotations removed and the final number boxed."""
    body, _, final = answer.rpartition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return f"{body}\nThe final answer is \\boxed{{{final.strip()}}}."


def _suite_turn(suite: str, item: dict) -> str:
    from ddtree_bench.suites.catalog import user_turns

    return user_turns(suite, item)[0]


def gsm8k_docs(data_dir: Path) -> list[list[int]]:
    path = Path(data_dir) / GSM8K_TRAIN
    with gzip.open(path, "rt", encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    return [chat_tokens([("user", _suite_turn("gsm8k", it)), ("assistant", gsm8k_answer(it["answer"]))]) for it in items]


def sharegpt_docs(data_dir: Path) -> list[list[int]]:
    docs = []
    with open(Path(data_dir) / SHAREGPT, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            conv = json.loads(line)["conversations"]
            turns = [("user" if m["from"] == "human" else "assistant", m["value"]) for m in conv]
            docs.append(chat_tokens(turns))
    return docs


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.stat().st_size <= MAX_FILE_BYTES)


def code_docs(files: list[Path]) -> tuple[list[list[int]], list[list[int]]]:
    """(raw source files, function-writing chats) from the standard library."""
    raw, chats = [], []
    for p in files:
        try:
            src = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        raw.append(encode_text(src))
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        lines = src.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not ast.get_docstring(node) or node.end_lineno is None:
                continue
            fn = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            if len(fn) > 2000:
                continue
            doc_end = node.body[0].end_lineno
            stub = "\n".join(lines[node.lineno - 1 : doc_end])
            user = _suite_turn("humaneval", {"prompt": stub + "\n"})
            chats.append(chat_tokens([("user", user), ("assistant", f"```python\n{fn}\n```")]))
    return raw, chats


@dataclass
class Corpus:
    """Named token streams (np.uint16, documents joined by <|endoftext|>) and sampling weights."""

    streams: dict[str, np.ndarray]
    weights: dict[str, float]
    prompts: dict[str, list[np.ndarray]]  # chat prefixes ending in "<|im_start|>assistant\n", per source

    def describe(self) -> dict[str, int]:
        return {k: int(v.size) for k, v in self.streams.items()}


def _join(docs: list[list[int]]) -> np.ndarray:
    out: list[int] = []
    for d in docs:
        out += d + [ENDOFTEXT]
    return np.asarray(out, dtype=np.uint16)


def _prompt_prefixes(docs: list[list[int]]) -> list[np.ndarray]:
    """Each chat up to and including its first assistant header: what the model sees at inference."""
    header = [IM_START] + encode_text("assistant\n")
    out = []
    for d in docs:
        for i in range(len(d) - len(header) + 1):
            if d[i : i + len(header)] == header:
                out.append(np.asarray(d[: i + len(header)], dtype=np.uint16))
                break
    return out


def build_corpus(data_dir: Path = DATA_DIR, weights: dict[str, float] | None = None, max_files: int | None = None) -> Corpus:
    files = stdlib_files()
    if max_files is not None:
        files = files[:max_files]
    raw, code_chats = code_docs(files)
    gsm, chat = gsm8k_docs(data_dir), sharegpt_docs(data_dir)
    streams = {"code": _join(raw), "code_chat": _join(code_chats), "gsm8k": _join(gsm), "chat": _join(chat)}
    weights = weights or {"code": 0.25, "code_chat": 0.15, "gsm8k": 0.4, "chat": 0.2}
    prompts = {"code_chat": _prompt_prefixes(code_chats), "gsm8k": _prompt_prefixes(gsm), "chat": _prompt_prefixes(chat)}
    return Corpus(streams, weights, prompts)
