"""Tessera: fused kernels for large-model training, from NumPy, PyTorch, JAX and CuPy.

    import numpy as np, tessera
    loss = tessera.linear_cross_entropy(x, w, labels)              # x [..., H], w [V, H], labels [...]
    loss = tessera.linear_cross_entropy(x, w, labels, reduction="sum", z_loss_weight=1e-4,
                                        softcap=30.0, implementation="cpu")

One function per kernel of the C++ registry, generated at import time from its description
(``tessera.kernels()``): required inputs positional, optional inputs and the C++ options
keyword-only. Inputs are any DLPack arrays, taken without a copy (CPU and CUDA); outputs come back
as the caller's array type. PyTorch tensors go through ``tessera.torch`` (a custom op with
autograd), JAX arrays through ``tessera.jax`` (XLA FFI, custom_vjp). Errors are the C++ one-line
messages as ValueError / TypeError. The GIL is released while a kernel runs.

``tessera.call(kernel, pass_, tensors, **options)`` runs any pass ("forward", "backward",
"fused") and returns every output by name (gradients included) for NumPy / CuPy arrays.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from . import _ext
from ._registry import (KERNELS, Kernel, canonical_keywords, dtype_text, memory_budget_bytes, outputs, public_outputs,
                        widen_mask)

__version__ = _ext.__version__
__all__ = ["call", "kernels", "implementations"] + sorted(KERNELS)


def kernels():
    """The kernels this build holds: name, description, inputs, options, implementations."""
    return _ext.kernels()


def implementations(kernel: str):
    """[{name, device, available, unavailable_reason, status, description}] for a kernel."""
    return _kernel(kernel).implementations


def _kernel(name: str) -> Kernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel '{name}' (kernels: {', '.join(KERNELS)})") from None


def _framework(tensors: Dict[str, Any]) -> str:
    for t in tensors.values():
        if t is None:
            continue
        mod = type(t).__module__
        if mod.startswith("torch"):
            return "torch"
        if mod.startswith("jax"):
            return "jax"
        if mod.startswith("cupy"):
            return "cupy"
    return "numpy"


_NP_DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def _empty(xp, dtype: str, shape, strides):
    """An uninitialized array of `shape` whose memory order follows `strides` (elements)."""
    if dtype == "bf16":
        import ml_dtypes
        dt = ml_dtypes.bfloat16
    else:
        dt = _NP_DTYPES[dtype]
    shape = tuple(shape)
    order = sorted(range(len(shape)), key=lambda i: -strides[i]) if strides else list(range(len(shape)))
    if order == list(range(len(shape))):
        return xp.empty(shape, dtype=dt)
    base = xp.empty(tuple(shape[i] for i in order), dtype=dt)
    return base.transpose([order.index(i) for i in range(len(shape))])


_ML_BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8}


def _ml_bits(t: Any):
    """The unsigned type whose view carries a NumPy array of an ml_dtypes type (bfloat16 as uint16,
    float8_e4m3fn as uint8), or None: DLPack and the buffer protocol cannot describe those dtypes,
    so such an array crosses as that view, and the extension is told what its bits hold."""
    return _ML_BITS.get(dtype_text(t.dtype)) if isinstance(t, np.ndarray) else None


def _array_in(kernel: str, name: str, t: Any, transposed: bool = False) -> Any:
    """An input as it crosses to the extension: a list, tuple or Python scalar becomes a NumPy
    array (Python floats as float32); a strided NumPy view (x[:, ::2], a slice of a fused
    projection) is copied once into a contiguous array, except a 2-D transposed view where the
    kernel reads one in place (`transposed`: linear_cross_entropy's w); CuPy and DLPack arrays pass
    as they are. A NumPy array in the other byte order cannot cross zero-copy: refused by name
    (nanobind's own error listed only signatures)."""
    if isinstance(t, (list, tuple, int, float)):
        t = np.asarray(t)
        if t.dtype == np.float64:  # Python floats: f32, the dtype every kernel takes
            t = t.astype(np.float32)
    if isinstance(t, np.ndarray) and not t.dtype.isnative:
        raise TypeError(f"{kernel}: {name} is a {t.dtype.str} array in the other byte order: pass "
                        f"{name}.astype({name}.dtype.newbyteorder('='))")
    if isinstance(t, np.ndarray) and not t.flags.c_contiguous and not (transposed and t.ndim == 2 and t.flags.f_contiguous):
        t = np.ascontiguousarray(t)
    return t


def _seed_words(t: Any) -> Any:
    """A random key (dropout_seed) given as uint32 words (a Philox key, JAX's raw PRNGKey as a
    NumPy array) crosses as the same bits in int32, the dtype the kernels take."""
    return t.view(np.int32) if isinstance(t, np.ndarray) and t.dtype == np.uint32 else t


def _view(kernel: str, name: str, t: Any, ml_bits: bool) -> Dict[str, Any]:
    try:
        return _ext.view(t, name, ml_bits=ml_bits)
    except TypeError as e:
        if "incompatible function arguments" not in str(e):  # the extension's own message (a dtype)
            raise
        raise TypeError(f"{kernel}: {name} ({type(t).__name__}) is not an array the extension can read in place: "
                        f"pass a NumPy array, or a CuPy / DLPack array of a supported dtype") from None


def call(kernel: str, pass_: str, tensors: Dict[str, Any], *, implementation: Optional[str] = None,
         num_threads: int = 0, memory_budget: Optional[int] = None, skip: Sequence[str] = (),
         **options) -> Dict[str, Any]:
    """Runs one pass of a kernel on NumPy (or CuPy / any DLPack) arrays; returns every output by name.

    tensors: the kernel's inputs by name, plus for "backward" / "fused" the upstream gradients
    (``grad_loss``) and optionally saved forward outputs (``lse``). memory_budget: bytes of extra
    memory the implementation may use (None: its default). skip: gradients a backward / fused
    pass leaves out, their work skipped (``skip=["dw"]`` for a frozen weight; the kernel's
    ``skippable`` ones), absent from the result.
    """
    k = _kernel(kernel)
    options = canonical_keywords(k.name, options)
    budget = memory_budget_bytes(memory_budget, k.name)
    transposed = {i.name for i in k.inputs if i.transposed}
    seeds = {i.name for i in k.inputs if i.seed_of}
    given = {n: widen_mask(_array_in(k.name, n, t, n in transposed)) for n, t in tensors.items() if t is not None}
    given = {n: _seed_words(t) if n in seeds else t for n, t in given.items()}
    bits = {n: _ml_bits(t) for n, t in given.items()}
    ml = {n for n, b in bits.items() if b is not None}
    given = {n: t.view(bits[n]) if n in ml else t for n, t in given.items()}
    opts = k.option_texts(options)
    metas = {}
    for n, t in given.items():
        v = _view(k.name, n, t, n in ml)
        metas[n] = (v["dtype"], v["shape"], v["strides"])
    skip = [n for n in skip.split(",") if n] if isinstance(skip, str) else list(skip)  # "dx,dw" too
    descs = outputs(k, pass_, metas, opts, skip)
    xp, stream = np, 0
    if _framework(given) == "cupy":
        import cupy as xp  # noqa: F811
        stream = xp.cuda.get_current_stream().ptr
    outs = [_empty(xp, d, s, st) for _, d, s, st in descs]
    out_bits = {i: _ml_bits(o) for i, o in enumerate(outs)}
    ml_outs = {i for i, b in out_bits.items() if b is not None}
    _ext.call(k.name, pass_, given, [o.view(out_bits[i]) if i in ml_outs else o for i, o in enumerate(outs)], opts,
              implementation or "", num_threads, stream, memory_budget=budget, skip=skip, ml_bits=ml,
              ml_bits_outputs=ml_outs)
    return {name: o for (name, _, _, _), o in zip(descs, outs)}


def _make(k: Kernel):
    def fn(*args, **kwargs):
        tensors, options, implementation, extras = k.bind(args, kwargs)
        fw = _framework(tensors)
        if fw == "torch":
            from . import torch as tt
            return getattr(tt, k.name)(*args, **kwargs)
        if fw == "jax":
            from . import jax as tj
            return getattr(tj, k.name)(*args, **kwargs)
        out = call(k.name, "forward", tensors, implementation=implementation, memory_budget=extras["memory_budget"],
                   **options)
        if not all(n in out for n in k.forward_outputs):  # e.g. linear_cross_entropy's vocab_total
            raise ValueError(f"{k.name}: these options select a partial form (outputs {', '.join(out)}), not "
                             f"{', '.join(k.forward_outputs)}: run it with tessera.call, or use tessera.parallel")
        public = public_outputs(k, list(out)) + list(k.wanted_saved(extras))
        return out[public[0]] if len(public) == 1 else tuple(out[n] for n in public)

    fn.__name__ = fn.__qualname__ = k.name
    fn.__signature__ = k.signature()
    fn.__doc__ = k.doc("NumPy / CuPy; PyTorch tensors go to tessera.torch, JAX arrays to tessera.jax") + k.returns_doc()
    return fn


for _name, _k in KERNELS.items():
    globals()[_name] = _make(_k)
del _name, _k
