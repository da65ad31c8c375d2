"""The bundled toy pair: its byte-level tokenizer, its offline training corpus and its training loop.

The trained weights live in `ddtree_bench/models/toy/{target,draft}`; `ddtree-bench toy train`
reproduces them.
"""
