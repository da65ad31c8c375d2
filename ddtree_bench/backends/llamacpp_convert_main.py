"""The GGUF conversion step that ddtree-bench runs: llama.cpp's own `convert_hf_to_gguf.py`, with two
adjustments for byte-level BPE tokenizers that have no merges (the bundled toy tokenizer and the tiny
test models that copy it). Run as a script by the converter's Python (the install script's venv),
never imported by ddtree-bench itself:

    PY llamacpp_convert_main.py LLAMA_CPP_DIR MODE MTP -- <convert_hf_to_gguf.py arguments>

MTP is `keep` or `absent`. `absent` (the caller found no MTP layers in the checkpoint) converts a model
class that can carry Qwen-style multi-token-prediction layers as `--no-mtp` would: without this the
converter stops on checkpoints that have none (Qwen3.5 without `mtp_num_hidden_layers`: `assert
self.opt_num_mtp_layers != 0`), and `--no-mtp` itself is an error for classes without MTP support, so the
choice is made per class here, after the converter has picked it.

MODE is `plain` (run the converter as it is) or `merge-less-byte-bpe` (the caller checked that
tokenizer.json is a byte-level BPE with an empty merge list). In that mode only:

1. An unknown BPE pre-tokenizer maps to `default`. The converter recognises pre-tokenizers by the
   hash of a test string's token ids and refuses unknown ones ("BPE pre-tokenizer was not
   recognized"; no flag overrides it). A pre-tokenizer only decides where text is split before BPE
   merges run inside each piece; with no merges every byte is its own token however the text is
   split, so any pre-tokenizer, `default` included, gives exactly the Hugging Face token ids.
   A recognised hash is kept as the converter found it.
2. One inert merge is written. gguf-py writes no merge list when tokenizer.json has none, and
   llama.cpp then refuses the model ("cannot find tokenizer merges"). The merge added joins the last
   two unused padding tokens of the vocabulary (`[PADn]`, type UNUSED). BPE starts from single
   bytes and only ever merges adjacent pieces whose texts form a listed pair; no text is split into
   pieces spelled `[PADn]`, so the merge never applies and tokenization is unchanged.
   A vocabulary without two unused tokens is refused with that reason.

Always (any MODE): a Qwen3.5 checkpoint whose `rope_parameters` has no `mrope_section` gets the converter's
default sections [11, 11, 10] (made for 64 rotary dimensions: head_dim 256 x partial_rotary_factor 0.25), and
llama.cpp aborts on a model with fewer (`GGML_ASSERT(sect_dims <= ne0)`; tiny test models have 4). The
default is then scaled to the model's rotary half-width. Exact for text: every token's M-RoPE position
components are equal, so which section a frequency belongs to does not change its angle; a real Qwen3.5
(64 rotary dimensions) keeps [11, 11, 10].

Knows the converter's module layout in the pinned llama.cpp (conversion/base.py: TextModel,
get_vocab_base_pre, get_vocab_base; gguf-py: SpecialVocab); nothing of ddtree-bench.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[3] != "--" or argv[1] not in ("plain", "merge-less-byte-bpe") or argv[2] not in ("keep", "absent"):
        raise SystemExit("usage: llamacpp_convert_main.py LLAMA_CPP_DIR plain|merge-less-byte-bpe keep|absent -- ARGS...")
    llama_dir, mode, mtp, args = Path(argv[0]), argv[1], argv[2], argv[4:]
    script = llama_dir / "convert_hf_to_gguf.py"
    sys.path.insert(0, str(llama_dir))
    sys.path.insert(1, str(llama_dir / "gguf-py"))
    if mode == "merge-less-byte-bpe":
        _patch_for_merge_less_bpe()
    if mtp == "absent":
        _patch_no_mtp()
    _patch_qwen35_mrope_default()
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")


def _patch_qwen35_mrope_default() -> None:
    from conversion import qwen

    mixin = getattr(qwen, "_Qwen35MRopeMixin", None)
    if mixin is None:
        return
    set_params = mixin.set_gguf_parameters

    def set_gguf_parameters(self):
        if "mrope_section" not in self.rope_parameters:
            hp = {**self.hparams, **(self.hparams.get("text_config") or {})}
            head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
            factor = self.rope_parameters.get("partial_rotary_factor", hp.get("partial_rotary_factor", 1.0))
            half = int(head_dim * factor) // 2
            default = [x for x in mixin._QWEN35_DEFAULT_MROPE_SECTION]
            if sum(default) != half and half > 0:
                a = round(default[0] * half / sum(default))
                b = min(round(default[1] * half / sum(default)), half - a)
                self._QWEN35_DEFAULT_MROPE_SECTION = [a, b, half - a - b, 0]
                print(f"ddtree-bench: M-RoPE sections {default[:3]} -> {self._QWEN35_DEFAULT_MROPE_SECTION[:3]} "
                      f"({2 * half} rotary dimensions)", file=sys.stderr)
        return set_params(self)

    mixin.set_gguf_parameters = set_gguf_parameters


def _patch_no_mtp() -> None:
    import conversion

    get_class = conversion.get_model_class

    def model_class(*a, **k):
        cls = get_class(*a, **k)
        if getattr(cls, "supports_mtp_export", False):
            cls.no_mtp = True
        return cls

    conversion.get_model_class = model_class


def _patch_for_merge_less_bpe() -> None:
    import gguf
    from conversion import base

    chosen: dict[str, str] = {}
    get_pre, get_vocab = base.TextModel.get_vocab_base_pre, base.TextModel.get_vocab_base

    def vocab_base_pre(self, tokenizer) -> str:
        try:
            return get_pre(self, tokenizer)
        except NotImplementedError:
            print("ddtree-bench: unknown BPE pre-tokenizer of a merge-less byte-level BPE -> 'default' "
                  "(exact: every byte is one token however the text is split)", file=sys.stderr)
            return "default"

    def vocab_base(self):
        tokens, toktypes, pre = get_vocab(self)
        unused = [t for t, k in zip(tokens, toktypes) if k == gguf.TokenType.UNUSED]
        if len(unused) < 2:
            raise SystemExit("ddtree-bench: the vocabulary has fewer than two unused padding tokens, so no inert "
                             "merge can be added (llama.cpp needs at least one merge for a BPE vocabulary)")
        chosen["merge"] = f"{unused[-2]} {unused[-1]}"
        return tokens, toktypes, pre

    add_to_gguf = gguf.SpecialVocab.add_to_gguf

    def add_merges_then(self, gw, quiet: bool = False):
        if self.load_merges and not self.merges and "merge" in chosen:
            print(f"ddtree-bench: adding the inert merge {chosen['merge']!r} (tokenizer.json has none)", file=sys.stderr)
            self.merges = [chosen["merge"]]
        return add_to_gguf(self, gw, quiet=quiet)

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    base.TextModel.get_vocab_base = vocab_base
    gguf.SpecialVocab.add_to_gguf = add_merges_then


if __name__ == "__main__":
    main(sys.argv[1:])
