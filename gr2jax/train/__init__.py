"""Training: one train-step factory, run checkpoints, inputs, evaluation and every recipe stage.

Sits on top of gr2jax.model, gr2jax.diffusion and gr2jax.data; nothing below imports it.
"""
