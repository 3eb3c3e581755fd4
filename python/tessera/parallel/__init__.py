"""Tessera's kernels past one device, through the engine the user already runs.

Tessera brings no communication of its own: the collectives are torch.distributed's (gloo on CPU
tensors, NCCL on CUDA tensors) or JAX's (inside ``shard_map``), and the kernels are the
single-device ones.

- ``tessera.parallel.torch``: expert-parallel grouped matmul (all-to-all token dispatch) and
  context-parallel attention (all-gather of keys and values), forward and backward; decode
  context parallelism over a paged KV cache (partials merged by lse), forward.
- ``tessera.parallel.jax``: the same three inside ``jax.shard_map``.

Every function checks its inputs on every rank and agrees on the outcome before the first
collective that carries data: a bad input on one rank makes every rank raise the same message
(naming the rank), instead of leaving the others waiting in a collective.
"""
