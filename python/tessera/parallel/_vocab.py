"""The vocab-parallel loss from the slices' combined statistics, written once for torch and JAX
(array-module agnostic: only arithmetic and ``where``). The formula is the kernel header's
(include/tessera/linear_cross_entropy.h, PartialOutputs):

    loss_t = weight_t·[(1−ε)(lse − z_y) + λ·lse²] + token_weight_t·ε/V·(Σσ·lse − Σσz)

weight_t = token_weight_t · σ[label_t] (σ = class weights, else 1); ignored tokens count 0;
the mean divides by Σ weight_t over the kept tokens (PyTorch's definition).
"""
from __future__ import annotations


def token_losses(where, lse, zy, sz, valid, weight, token_weight, *, smoothing: float, z_loss: float,
                 vocab: int, sigma_sum):
    """Per-token loss and z-loss part (0 where not valid)."""
    main = weight * ((1.0 - smoothing) * (lse - zy) + z_loss * lse * lse)
    # Absent without smoothing: a masked (−inf) class makes sz −inf, and 0·inf would be NaN.
    smooth = token_weight * (smoothing / vocab) * (sigma_sum * lse - sz) if smoothing else 0.0 * lse
    return where(valid, main + smooth, 0.0 * lse), where(valid, weight * z_loss * lse * lse, 0.0 * lse)


def reduce(where, per_token, weight_kept, reduction: str):
    """none / sum / mean (mean over Σ weight of the kept tokens; 0 when there are none)."""
    if reduction == "none":
        return per_token
    total = per_token.sum()
    if reduction == "sum":
        return total
    denom = weight_kept.sum()
    return where(denom == 0, 0.0 * total, total / where(denom == 0, 1.0 + 0.0 * denom, denom))
