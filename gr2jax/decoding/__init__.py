"""Inference: the decode spec (spec.py), the policies and make_policy (policy.py), prompt I/O
(prompt_io.py), the one evaluation (evaluation.py), the Reranker (reranker.py) and the inference
bundle a stage's export carries so that it re-ranks alone (bundle.py).

Sits on top of gr2jax.model, gr2jax.diffusion and gr2jax.data; gr2jax.train builds on it, and
nothing here imports gr2jax.train.
"""
