"""The reference in-process engine: Qwen3 / Llama targets (and, in hybrid/, Gated DeltaNet hybrid and MoE
targets), the z-lab DFlash drafter, and AR, DFlash and DDTree generation, in plain PyTorch - plus its GPU
fast path in gpu/.

It knows token ids, tensors and HF model directories; it knows nothing of HTTP, suites, chat
messages or results files. Start at `generate.Engine`; `ddtree_bench.pair.load_pair` builds one
from disk (with `loading.load_target` / `loading.load_drafter`).

Reference files: config (HF config.json -> dataclasses), layers (norm, rope, attention, MLP), model
(target), draft (DFlash drafter), proposer (the drafter as a round's step 1), cache (preallocated
position-indexed KV cache + compaction), tree (best-first tree build: the heap and the vectorised
build, verify inputs), tree_vector (the vectorised build's exact keys and `StaticTreeBuilder`),
verify (sampling and the tree walk, slow and fast), generate (the reference loop and the `Engine`
dispatcher), interface (what both halves share: Generation, OutputStream, RoundTrace, the proposer
protocol, the walk-result layout, the last-round rule), loading (directories, safetensors), facts
(what run.json records about a pair: drafter attention mode, stop-id rule), checkpoint (safetensors
into a module, checked), draft_variants (documented drafter deviations, for `explain`), target_variants
(target-side faults such as `gdn-crop`, for testing the tool and for `explain`), batch (continuous batching: the batched plain loop), batch_forward
(the target's and drafter's forward over several requests: weights once, attention per request),
batch_scheduler (the engine thread that feeds the batched loop from other threads).
hybrid/ holds the Gated DeltaNet and MoE targets (see hybrid/__init__.py); gpu/ is the CUDA-graph loop
and everything only it uses (see gpu/__init__.py).
"""
