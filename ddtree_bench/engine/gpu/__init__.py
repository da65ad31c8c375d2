"""The GPU fast path of the engine: the same tokens as the reference loop, organised for a GPU.

Files: loop (FastLoop: fixed shapes, CUDA graphs, one host sync a round), forward (fixed-shape
target and drafter forwards over a static cache), tree_ops (fixed-shape verify inputs, walk and
commit), builders (the tree-builder registry: check, time, choose), graphs (CUDA-graph capture and
replay), fused (merged projections and the choice of layer ops), ops (the layer ops' PyTorch twin),
_probe (the benchmarks' one entry to kernel knobs), kernels/ (every Triton kernel, sharing
kernels/common.py). It imports the reference engine's model, tree build and shared types
(engine/interface.py); nothing in the reference engine imports it except `generate.Engine`, which
dispatches to it.
"""
