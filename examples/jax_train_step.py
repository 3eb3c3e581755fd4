"""A tiny language-model head trained with Tessera's fused linear cross-entropy (JAX).

tessera.jax.linear_cross_entropy is an XLA FFI call with a custom_vjp: the jitted step below
runs the kernel inside the compiled program (no callback) and never forms the logits.
Run: python examples/jax_train_step.py
"""
import jax
import jax.numpy as jnp

import tessera.jax as tj

V, H, B, T = 1024, 128, 8, 64              # vocabulary, hidden, batch, sequence
k_embed, k_mlp, k_head, k_data = jax.random.split(jax.random.PRNGKey(0), 4)
params = {
    "embed": jax.random.normal(k_embed, (V, H)) * 0.02,
    "mlp": jax.random.normal(k_mlp, (H, H)) * H**-0.5,
    "lm_head": jax.random.normal(k_head, (V, H)) * 0.02,   # [V, H] like PyTorch's lm_head.weight
}


def loss_fn(params, tokens, labels):
    h = params["embed"][tokens]                              # hidden states [B, T, H]
    h = h + jax.nn.gelu(h @ params["mlp"])
    h = h / jnp.linalg.norm(h, axis=-1, keepdims=True) * H**0.5
    return tj.linear_cross_entropy(h, params["lm_head"], labels, z_loss_weight=1e-4)


@jax.jit
def train_step(params, tokens, labels, lr=2.0):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, labels)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


for step in range(30):
    tokens = jax.random.randint(jax.random.fold_in(k_data, step), (B, T), 0, V)
    labels = (tokens * 7 + 3) % V                            # next = 7 * token + 3
    params, loss = train_step(params, tokens, labels)
    if step % 5 == 0 or step == 29:
        print(f"step {step:2d}  loss {float(loss):.4f}")
