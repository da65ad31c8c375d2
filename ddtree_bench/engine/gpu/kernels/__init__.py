"""Every Triton kernel of the GPU path, each beside its launch wrapper and checked against a PyTorch
twin: tree_block (one-block tree build), tree_grid (grid tree build), tree_pruned (what both share),
topk (per-depth top-K), tree_verify (tree compile, walk, commit), argmax (the walk's greedy picks),
layer_ops (fused RMSNorm / RoPE / SiLU), attention (attention over the live cache slots). common holds
the Triton import and the shared helpers; cache_dir says where compiled kernels persist.
Importable without Triton: the kernels are then undefined and callers use the twins.
"""
