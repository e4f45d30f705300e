"""Training: one train-step factory, run checkpoints, training batches and every recipe stage.

Sits on top of gr2jax.model, gr2jax.diffusion, gr2jax.data and gr2jax.decoding (the policies,
the evaluation); nothing below imports it.
"""
