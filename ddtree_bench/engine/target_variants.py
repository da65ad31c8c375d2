"""Target-side engine variants: known ways a serving engine's TARGET (not its drafter) can deviate.

A `TargetVariant` describes one deviation of the target's verify/commit from the exact reference
(`REFERENCE_TARGET`). The reference engine can run under one, as a FAULT INJECTION for testing the tool
(`run` / `serve --target-variant NAME`) and so that `explain` can name the deviation behind a run.
Unlike drafter variants they change what the target commits, so a run under one is not lossless and
cannot reuse the reference decode.

| name | deviation it models | applies to |
|---|---|---|
| `reference` | none: attention K/V and GDN states committed at the accepted path | every target |
| `gdn-crop` | what transformers' `Cache.crop` does after a verify: attention K/V cropped to the accepted length, GDN conv and recurrent state left as after the WHOLE verified block (rejected drafts included; z-lab/dflash#172, huggingface/transformers#49036) | hybrid (GDN) targets |

`parse_target_variant(name)` reads the CLI spelling; `target_catalog(is_hybrid)` lists the variants that
apply to a target; `apply_target_variant(target, variant)` switches a loaded target (from its next forward
on; `load_target(..., target_variant=)` does it at load); `apply_to_pair(pair, name)` also records it in
the pair's info. Knows nothing of drafters, runs or files.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_bench.errors import UsageError


@dataclass(frozen=True)
class TargetVariant:
    """One target-side deviation (defaults = none). `name` is the CLI spelling."""

    name: str = "reference"
    gdn_crop: bool = False          # GDN state/conv left as after the whole verified block
    hybrid_only: bool = False
    doc: str = "the exact reference: attention K/V and GDN states committed at the accepted path"


REFERENCE_TARGET = TargetVariant()
GDN_CROP = TargetVariant(
    name="gdn-crop", gdn_crop=True, hybrid_only=True,
    doc="transformers' Cache.crop after a verify: attention cropped to the accepted length, GDN conv and "
        "recurrent state left as after the whole verified block (rejected drafts kept)")
TARGET_VARIANTS = {v.name: v for v in (REFERENCE_TARGET, GDN_CROP)}


def parse_target_variant(name: str | None) -> TargetVariant:
    if name is None or name == "":
        return REFERENCE_TARGET
    if name not in TARGET_VARIANTS:
        raise UsageError(f"unknown target variant {name!r}; expected one of {', '.join(TARGET_VARIANTS)}")
    return TARGET_VARIANTS[name]


def target_catalog(is_hybrid: bool) -> list[TargetVariant]:
    """The variants that apply to a target (the reference first)."""
    return [v for v in TARGET_VARIANTS.values() if is_hybrid or not v.hybrid_only]


def apply_to_pair(pair, name: str | None) -> None:
    """Run a loaded pair's (pair.LoadedPair) target under the variant `name` (None: the reference) and
    record it in pair.info (run.json's backend section, serve's /server_info)."""
    variant = parse_target_variant(name)
    apply_target_variant(pair.engine.target, variant)
    pair.info["target_variant"] = variant.name


def apply_target_variant(target, variant: TargetVariant) -> None:
    """Run `target` under `variant` from its next cache on (UsageError if it does not apply)."""
    hybrid = bool(getattr(target, "is_hybrid", False)) and bool(getattr(target.cfg, "gdn_layers", ()))
    if variant.hybrid_only and not hybrid:
        raise UsageError(f"target variant {variant.name!r} applies to hybrid (Gated DeltaNet) targets only")
    if hasattr(target, "variant"):
        target.variant = variant
