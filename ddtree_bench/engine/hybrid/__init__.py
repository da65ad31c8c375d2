"""Hybrid (Gated DeltaNet + attention) and MoE targets for the reference engine: Qwen3.5 / Qwen3.6
(`qwen3_5_text`, `qwen3_5`), Qwen3.5-MoE, Qwen3-Next and Qwen3-MoE.

Read in this order: config (the five config layouts), gdn (the recurrence), tree_verify (GDN over a verify
tree: one batched step per depth, the per-node twin, the flat negative control), state (the per-layer
state objects and the commit), replay (the memory-lean exact commit and the per-node memory formulas),
model (`HybridTarget`, the engine's Target interface), loading (checkpoint names). norms, attention and
moe are the layers around the recurrence. docs/hybrid-targets.md explains the verify and the evidence.
The fault-injection variant `gdn-crop` lives in engine/target_variants.py. Nothing here imports
transformers' model code (it is the tests' oracle only).
"""
