"""Tessera's kernels in JAX: XLA FFI calls (no host round trip, no callback) with a custom_vjp.

    import jax, jax.numpy as jnp, tessera.jax as tj
    loss = tj.linear_cross_entropy(x, w, labels)                 # x [..., H], w [V, H], labels [...]
    g = jax.jit(jax.grad(lambda x, w: tj.linear_cross_entropy(x, w, labels, z_loss_weight=1e-4),
                         argnums=(0, 1)))(x, w)

One function per kernel of the registry (the same signature as ``tessera.<kernel>``). The forward
pass runs the kernel's "forward" (keeping ``lse``), the VJP its "backward" with the saved ``lse``
and the upstream gradient. When the loss is a scalar (linear_cross_entropy with reduction "sum"
or "mean") the custom_vjp's fwd rule (taken under jax.grad / vjp only) runs the "fused" pass
instead, as Liger-Kernel does: loss and dx / dw / dbias at once for an upstream gradient of 1,
kept as residuals (allocated in the forward, held until the backward) and scaled by the upstream
gradient in the VJP; no second pass recomputes the logits. A plain call runs "forward" alone.
``frozen=("w",)`` treats inputs as constants (zero gradient, like jax.lax.stop_gradient) and
skips their gradient work; the kernels whose gradients can be skipped take it (``skippable``:
linear_cross_entropy's x, w, bias; grouped_matmul's lhs, rhs): JAX cannot tell a custom_vjp which inputs are differentiated reliably (symbolic_zeros
shares one residual layout between patterns: wrong gradients), so the caller says it. Options are static (part of the jit cache key). Inputs without a
gradient in the kernel (labels, token_weights) get a zero cotangent: token_weights are treated as
constants. The handlers are compiled into tessera._ext and registered with ``jax.ffi`` for CPU
and CUDA (the CUDA one reaches the GPU through Tessera's CUDA module; without it a call fails
saying why).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _ext
from ._registry import (KERNELS, Kernel, canonical_keywords, dtype_name, memory_budget_bytes, outputs,
                        public_outputs, widen_mask)

__all__ = sorted(KERNELS) + ["dot_product_attention"]

_TARGET = "tessera_call"
for _platform, _capsule in _ext.ffi_targets().items():
    jax.ffi.register_ffi_target(_TARGET, _capsule, platform=_platform)

_JNP = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "i32": jnp.int32, "i64": jnp.int64}


# How a call runs, beside its options: (implementation, memory_budget in bytes; 0: the default).
Exec = Tuple[str, int]


def _ffi(k: Kernel, pass_: str, tensors: Dict[str, Any], options: Tuple[Tuple[str, str], ...], ex: Exec,
         skip: Tuple[str, ...] = ()):
    """One pass through the FFI: {output name: array}, without the gradients in `skip` (their work
    skipped). Shapes come from the C++ CallSpec."""
    names = [n for n, t in tensors.items() if t is not None]
    args = [tensors[n] for n in names]
    metas = {n: (dtype_name(t.dtype), list(t.shape), []) for n, t in zip(names, args)}
    descs = outputs(k, pass_, metas, dict(options), skip)
    result = [jax.ShapeDtypeStruct(tuple(s), _JNP[d]) for _, d, s, _ in descs]
    outs = jax.ffi.ffi_call(_TARGET, result, vmap_method="sequential")(
        *args, kernel=k.name, pass_=pass_, names=",".join(names),
        options=";".join(f"{n}={v}" for n, v in options), implementation=ex[0], memory_budget=np.int64(ex[1]),
        skip=",".join(skip))
    # Inside shard_map the results vary over every mesh axis an input varies over (typed as
    # invariant, a result used beside varying values gets an implicit pvary, whose transpose sums
    # the cotangent over the devices: wrong gradients).
    axes = frozenset().union(*(_varying_axes(a) for a in args)) if args else frozenset()
    return {name: _mark_varying(o, axes) for (name, _, _, _), o in zip(descs, outs)}


def _varying_axes(x) -> frozenset:
    """The mesh axes x varies over inside shard_map (JAX >= 0.10: manual_axis_type; before: vma)."""
    t = jax.typeof(x)
    m = getattr(t, "manual_axis_type", None)
    return frozenset(m.varying) if m is not None else frozenset(getattr(t, "vma", ()))


def _mark_varying(x, axes: frozenset):
    """x typed as varying over `axes` too (a no-op on the values)."""
    missing = tuple(sorted(axes - _varying_axes(x)))
    if not missing:
        return x
    pcast = getattr(jax.lax, "pcast", None)
    return pcast(x, missing, to="varying") if pcast is not None else jax.lax.pvary(x, missing)


def _varying_like(g, primal):
    """Inside shard_map a cotangent must vary over exactly the mesh axes of its primal (check_vma):
    summed over the axes the primal is the same on (a replicated weight used with sharded data:
    the transpose of the implicit broadcast), marked varying over the others."""
    extra = tuple(sorted(_varying_axes(g) - _varying_axes(primal)))
    if extra:
        g = jax.lax.psum(g, extra)
    return _mark_varying(g, _varying_axes(primal))


@functools.lru_cache(maxsize=None)
def _differentiable(kname: str, present: Tuple[str, ...], options: Tuple[Tuple[str, str], ...], ex: Exec,
                    saved_wanted: Tuple[str, ...] = (), frozen: Tuple[str, ...] = ()):
    """A custom_vjp function of the present inputs (positional, in `present` order); the saved
    outputs in `saved_wanted` (lse) come last. The `frozen` inputs get a zero cotangent and their
    gradients are left out of the kernel's calls (their work skipped)."""
    k = KERNELS[kname]
    diff = {i.name for i in k.inputs if i.differentiable}
    skip = tuple("d" + n for n in frozen)  # static: part of this function's identity

    def forward_descs(args):
        metas = {n: (dtype_name(a.dtype), list(a.shape), []) for n, a in zip(present, args)}
        return outputs(k, "forward", metas, dict(options))

    def public_names(args):
        """The names of primal_out's outputs (static: from the shapes and the options)."""
        return public_outputs(k, [d[0] for d in forward_descs(args)]) + list(saved_wanted)

    def primal_out(out, args):
        public = public_names(args)
        return out[public[0]] if len(public) == 1 else tuple(out[n] for n in public)

    def fused_in_forward(args) -> bool:
        """A scalar loss whose cotangent is the only one the backward takes (linear_cross_entropy
        with reduction sum / mean): the fwd rule runs the fused pass, as Liger-Kernel does."""
        descs = {d[0]: d[2] for d in forward_descs(args)}
        return ("fused" in k.passes and all(descs.get(n) == [] for n in k.forward_outputs) and
                not any(k.takes_grad(n) for n in public_names(args) if n not in k.forward_outputs))

    def takes(n: str) -> bool:
        """Input n gets a cotangent from the kernel (differentiable and not frozen)."""
        return n in diff and n not in frozen

    @jax.custom_vjp
    def f(*args):
        return primal_out(_ffi(k, "forward", dict(zip(present, args)), options, ex), args)

    def fwd(*args):
        tensors = dict(zip(present, args))
        if fused_in_forward(args):  # loss and gradients at once, for an upstream gradient of 1
            tensors.update({"grad_" + n: jnp.ones((), jnp.float32) for n in k.forward_outputs})
            out = _ffi(k, "fused", tensors, options, ex, skip)
            return primal_out(out, args), (args, {}, {n: out["d" + n] for n in present if takes(n)})
        out = _ffi(k, "forward", tensors, options, ex)
        saved = {n: out[n] for n in k.saved_outputs if n in out}
        return primal_out(out, args), (args, saved, None)

    def scaled(d, g):
        """d times the upstream scalar g (in f32, rounded once to d's dtype); d itself when g == 1."""
        return jax.lax.cond(g == 1, lambda d: d, lambda d: (d.astype(jnp.float32) * g).astype(d.dtype), d)

    def bwd(res, g):
        if k.forward_only:  # a zero gradient would hide that none exists
            raise TypeError(k.no_gradient("apply jax.lax.stop_gradient to its inputs"))
        args, saved, fused = res
        public = public_names(args)
        gs = g if isinstance(g, tuple) else (g,)
        if fused is not None:
            g0 = jnp.asarray(gs[0], jnp.float32)
            return tuple(_varying_like(scaled(fused[n], g0), a) if n in fused else None for n, a in zip(present, args))
        tensors = dict(zip(present, args))
        # Upstream gradients of the outputs that take one: the forward_outputs (the first public
        # outputs) and those whose grad_<name> the backward declares (last states).
        for i, (name, gi) in enumerate(zip(public, gs)):
            if k.takes_grad(name):  # a forward output's in its own dtype (as in tessera.torch), last states f32
                first = i < len(k.forward_outputs)
                tensors["grad_" + name] = jnp.asarray(gi) if first else jnp.asarray(gi, jnp.float32)
        tensors.update(saved)
        grads = _ffi(k, "backward", tensors, options, ex, skip)
        return tuple(_varying_like(grads["d" + n], a) if takes(n) else None for n, a in zip(present, args))

    f.defvjp(fwd, bwd)
    return f


def _frozen_of(k: Kernel, frozen) -> Tuple[str, ...]:
    """`frozen=` as a sorted tuple of input names ("w", "w,bias" or a sequence), each an input
    whose gradient the kernel can skip."""
    names = [n for n in frozen.split(",") if n] if isinstance(frozen, str) else list(frozen or ())
    allowed = [i.name for i in k.inputs if i.differentiable and "d" + i.name in k.skippable]
    for n in names:
        if n not in allowed:
            raise ValueError(f"{k.name}: frozen={n!r} is not an input whose gradient can be skipped "
                             f"(frozen: {', '.join(allowed) or 'none'})")
    return tuple(sorted(set(names)))


def _key_words(key):
    """A random key input (dropout_seed) as the i32 words the kernels take: a JAX key — typed
    (``jax.random.key``) or raw (``jax.random.PRNGKey``, uint32 [2]) — gives its two words, bit-cast;
    an i32 array passes as it is. A key of another implementation than threefry (rbg: 4 words) is
    refused by the kernel's shape check."""
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return jax.lax.bitcast_convert_type(key, jnp.int32) if key.dtype == jnp.uint32 else key


_FROZEN = inspect.Parameter("frozen", inspect.Parameter.KEYWORD_ONLY, default=())


def _make(k: Kernel):
    extra = (_FROZEN,) if k.skippable else ()

    def fn(*args, **kwargs):
        tensors, options, implementation, extras = k.bind(args, kwargs, extra)
        frozen = _frozen_of(k, extras.get("frozen", ()))
        ex = (implementation, extras["memory_budget"])
        present = tuple(n for n, t in tensors.items() if t is not None)
        seeds = {i.name for i in k.inputs if i.seed_of}
        arrays = [_key_words(tensors[n]) if n in seeds else widen_mask(jnp.asarray(tensors[n])) for n in present]
        opts = tuple(sorted(k.option_texts(options).items()))
        wanted = k.wanted_saved(extras)
        out = _differentiable(k.name, present, opts, ex, wanted, tuple(n for n in frozen if n in present))(*arrays)
        if not isinstance(out, tuple) or k.forward_only:  # forward only: every output says so in bwd
            return out
        # No gradient flows through an output whose cotangent the VJP ignores (a saved lse, m_last,
        # argmax): say so to JAX, as tessera.torch marks them non-differentiable.
        metas = {n: (dtype_name(a.dtype), list(a.shape), []) for n, a in zip(present, arrays)}
        names = public_outputs(k, [d[0] for d in outputs(k, "forward", metas, dict(opts))]) + list(wanted)
        return tuple(o if k.takes_grad(n) else jax.lax.stop_gradient(o) for n, o in zip(names, out))

    fn.__name__ = fn.__qualname__ = k.name
    fn.__signature__ = k.signature(extra)
    doc = k.doc("JAX: XLA FFI + custom_vjp; works under jit and grad (vmap runs it per element)")
    if k.skippable:
        allowed = ", ".join(i.name for i in k.inputs if i.differentiable and "d" + i.name in k.skippable)
        doc += (f"\n  frozen=(): inputs treated as constants ({allowed}): a zero gradient, and their gradient work "
                "skipped (a frozen lm_head under LoRA: frozen=\"w\")")
    fn.__doc__ = doc + k.returns_doc()
    return fn


def call(kernel: str, pass_: str, tensors: Dict[str, Any], *, implementation: str = "",
         memory_budget: Optional[int] = None, skip: Sequence[str] = (), **options):
    """One pass of a kernel on JAX arrays (jit-able, no autodiff): {output name: array}. skip:
    gradients a backward / fused pass leaves out (the kernel's ``skippable``), absent from the result."""
    k = KERNELS[kernel]
    ex = (implementation or "", memory_budget_bytes(memory_budget, kernel))
    skip = tuple(n for n in skip.split(",") if n) if isinstance(skip, str) else tuple(skip)
    return _ffi(k, pass_, tensors, tuple(sorted(k.option_texts(options).items())), ex, skip)


for _name, _k in KERNELS.items():
    globals()[_name] = _make(_k)
del _name, _k


_single_device_linear_cross_entropy = linear_cross_entropy  # noqa: F821 - generated above


def linear_cross_entropy(x, w, labels, *, vocab_start=None, axis_name=None, **kwargs):
    kwargs = canonical_keywords("linear_cross_entropy", kwargs)  # soft_cap= still works
    if kwargs.get("vocab_total"):
        raise ValueError("linear_cross_entropy: pass vocab_start= and axis_name= for a vocab-parallel loss; "
                         "vocab_total is the kernel's partial form, which tessera.parallel.jax drives")
    if axis_name is None:
        if vocab_start is not None:
            raise ValueError("linear_cross_entropy: vocab_start needs axis_name (the mesh axis the classifier is split over)")
        return _single_device_linear_cross_entropy(x, w, labels, **kwargs)
    from .parallel.jax import vocab_parallel_linear_cross_entropy
    return vocab_parallel_linear_cross_entropy(x, w, labels, vocab_start=0 if vocab_start is None else vocab_start,
                                               axis_name=axis_name, **kwargs)


linear_cross_entropy.__doc__ = (_single_device_linear_cross_entropy.__doc__ or "") + """

Vocab-parallel (docs/DISTRIBUTED.md), inside shard_map: with ``vocab_start=s, axis_name="tp"`` w
holds classes [s, s + V_d) on this device (``s`` may be traced, e.g. ``lax.axis_index("tp") *
V_d``); the loss and gradients equal one device's."""



def _signed_scale(query, scale):
    """A scale of 0 or below as the kernel takes it (> 0): 0 scores every key alike (q·0), a negative
    scale flips q. The frameworks take both."""
    if scale is None or scale > 0:
        return query, scale
    return (query * 0, 1.0) if scale == 0 else (-query, -scale)


def _dpa_bias(bias, mask, is_causal, local_window_size, kv_lengths, T, S, dtype):
    """jax.nn.dot_product_attention's bias, bool mask, top-left is_causal / local window (when
    T != S) and key lengths as tessera's one bias [B|1, N|1, T|1, S|1] (−inf where masked), or None."""
    def four(x):
        if x.ndim > 4:
            raise ValueError(f"a bias or mask must broadcast to [B, N, T, S], got {x.shape}")
        return x.reshape((1,) * (4 - x.ndim) + x.shape)

    keep = None if mask is None else four(jnp.asarray(mask, bool))
    i, j = jnp.arange(T)[:, None], jnp.arange(S)[None, :]
    if is_causal or local_window_size is not None:  # T != S: top-left, as JAX's own masks
        rule = j <= i if is_causal else jnp.ones((T, S), bool)
        if local_window_size is not None:
            left, right = local_window_size
            rule = rule & (j >= i - left) & (j <= i + right)
        keep = rule[None, None] if keep is None else keep & rule[None, None]
    if kv_lengths is not None:  # keys past each sequence's length: a key padding mask [B, 1, 1, S]
        pad = j[0][None, :] < jnp.asarray(kv_lengths)[:, None]
        keep = pad[:, None, None, :] if keep is None else keep & pad[:, None, None, :]
    out = None if bias is None else four(jnp.asarray(bias))
    if out is not None and out.dtype not in (jnp.dtype(jnp.float32), jnp.dtype(dtype)):
        out = out.astype(jnp.float32)  # the kernel takes f32 or q's dtype
    if keep is not None:
        neg = jnp.where(keep, jnp.zeros((), dtype), jnp.asarray(-jnp.inf, dtype))
        out = neg if out is None else out + neg
    return out


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, **kwargs):
    """``jax.nn.dot_product_attention``'s call on tessera's attention kernel.

    query [B, T, N, H], key / value [B, S, K, H] (N a multiple of K), or without B; bias (added to
    the scores, differentiable) and mask (bool, True takes part) broadcastable to [B, N, T, S] with
    each dim 1 or full; is_causal and local_window_size=(left, right) aligned top-left as JAX's
    (native options when T == S, else a bias); key_value_seq_lengths [B] as a key padding mask.
    implementation: one of tessera's ("cpu", "cuda", "cudnn", "reference"; None: dispatch), not
    JAX's "xla". Differences: a row whose keys are all masked gives 0 (JAX masks with a large finite
    negative, so it gives the mean of v there); query_seq_lengths and return_residual are not
    taken (NotImplementedError). Other keywords (softcap=, dropout_p= with dropout_seed=,
    block_sizes=, ...) go to ``tessera.jax.attention``."""
    if query_seq_lengths is not None:
        raise NotImplementedError("dot_product_attention: query_seq_lengths (pass the padded rows and ignore them, or "
                                  "a mask)")
    if kwargs.pop("return_residual", False):
        raise NotImplementedError("dot_product_attention: return_residual (tessera.jax.call('attention', 'forward', "
                                  "...) returns o and lse)")
    if isinstance(local_window_size, int):  # JAX's int: a symmetric window
        local_window_size = (local_window_size, local_window_size)
    query, scale = _signed_scale(query, scale)
    if implementation == "xla":
        raise ValueError("dot_product_attention: implementation='xla' is JAX's; tessera runs its own (cpu, cuda, "
                         "cudnn, reference; None dispatches)")
    three = query.ndim == 3
    if three:
        query, key, value = query[None], key[None], value[None]
        if key_value_seq_lengths is not None:
            key_value_seq_lengths = jnp.reshape(jnp.asarray(key_value_seq_lengths), (1,))
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(f"dot_product_attention: query, key, value must be [B, T, N, H] or [T, N, H], got "
                         f"{query.shape}, {key.shape}, {value.shape}")
    T, S = query.shape[1], key.shape[1]
    options = dict(kwargs)
    # The native masks where they coincide with JAX's top-left ones: T == S, a window of sizes >= 0
    # (the kernel reads −1 as unbounded, JAX as one key short of the diagonal).
    native = T == S and (local_window_size is None or min(local_window_size) >= 0)
    if native:
        options["causal"] = bool(is_causal)
        if local_window_size is not None:
            options["window_left"], options["window_right"] = local_window_size
    b = _dpa_bias(bias, mask, is_causal and not native, None if native else local_window_size, key_value_seq_lengths,
                  T, S, query.dtype)
    if b is not None:
        options["bias"] = b
    if scale is not None:
        options["scale"] = scale
    if implementation is not None:
        options["implementation"] = implementation
    o = attention(query, key, value, **options)  # noqa: F821 - generated above
    return o[0] if three else o
