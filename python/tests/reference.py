"""The materialized loss in float64 NumPy (the tests' oracle for values), and random problems."""
import numpy as np


def problem(B=24, H=32, V=80, seed=0, ignore=True):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((B, H)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 0.3).astype(np.float32)
    y = rng.integers(0, V, B).astype(np.int64)
    if ignore:
        y[::5] = -100
    return x, w, y


def loss(x, w, y, *, bias=None, token_weights=None, reduction="mean", ignore_index=-100,
         label_smoothing=0.0, z_loss_weight=0.0, softcap=0.0):
    x = np.asarray(x, np.float64)
    z = x.reshape(-1, x.shape[-1]) @ np.asarray(w, np.float64).T
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    if softcap:
        z = softcap * np.tanh(z / softcap)
    y = np.asarray(y).reshape(-1)
    m = z.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]
    keep = y != ignore_index
    zy = z[np.arange(len(y)), np.where(keep, y, 0)]
    ce = (1 - label_smoothing) * (lse - zy) + label_smoothing * (lse - z.mean(-1))
    tw = np.ones(len(y)) if token_weights is None else np.asarray(token_weights, np.float64).reshape(-1)
    per = np.where(keep, tw * (ce + z_loss_weight * lse**2), 0.0)
    if reduction == "none":
        return per.reshape(np.shape(x)[:-1])
    if reduction == "sum":
        return per.sum()
    d = (tw * keep).sum()
    return per.sum() / d if d else 0.0
