"""The reference in-process engine: Qwen3 / Llama targets, the z-lab DFlash drafter, and AR, DFlash
and DDTree generation, in plain PyTorch.

It knows token ids, tensors and HF model directories; it knows nothing of HTTP, suites, chat
messages or results files. Start at `generate.Engine`; `loading.load_pair` builds one from disk.

Files: config (HF config.json -> dataclasses), layers (norm, rope, attention, MLP), model (target),
draft (DFlash drafter), cache (preallocated position-indexed KV cache + compaction), tree (best-first
tree build, slow heap twin and fast vectorised path, verify inputs), verify (sampling and the tree
walk, slow and fast), generate (the AR / DFlash / DDTree loops), loading (directories, safetensors).
"""
