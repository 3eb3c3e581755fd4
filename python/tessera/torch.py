"""Tessera's kernels in PyTorch: ``torch.library`` custom ops with autograd.

    import torch, tessera.torch as tt
    loss = tt.linear_cross_entropy(hidden, lm_head.weight, labels)   # hidden [..., H], weight [V, H]
    loss.backward()

For each kernel of the registry two ops are defined, their schemas generated from its CallSpec:
``torch.ops.tessera.<kernel>`` (the forward pass; returns every forward output, the saved ones
included) and ``torch.ops.tessera.<kernel>_backward`` (the gradients, given the upstream gradient
and the saved outputs). Each has a fake (meta) implementation whose shapes come from the C++
spec, and the forward op has its autograd registered, so ``torch.compile(fullgraph=True)`` keeps
the op in the graph. CPU tensors run the CPU implementations; CUDA tensors the cuda
implementation on the tensor's current stream. Tensors are handed to the kernel through DLPack
without a copy; outputs are allocated by PyTorch (its caching allocator on CUDA).

``LinearCrossEntropyLoss`` is an ``nn.Module`` with the call signature of Liger-Kernel's
``LigerFusedLinearCrossEntropyLoss``; ``linear_cross_entropy(x, w, labels)`` takes CCE's
``linear_cross_entropy(e, c, targets)`` arguments in the same order (see the README's mapping).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from . import _ext
from ._registry import KERNELS, Kernel, canonical_keywords, dtype_name, memory_budget_bytes, widen_mask

__all__ = sorted(KERNELS) + ["LinearCrossEntropyLoss", "scaled_dot_product_attention"]

_TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32, "i64": torch.int64}
_SCHEMA_TYPES = {"flag": "bool", "int": "int", "float": "float", "str": "str"}

_lib = torch.library.Library("tessera", "DEF")

# Inductor keeps these ops out of captured CUDA graphs: the kernels read inputs on the host (group
# sizes, page tables, lengths: copied there inside the op) or synchronize with it
# (linear_cross_entropy's cuda backend checks the labels), which a capturing stream refuses.
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


def _default_literal(o) -> str:
    if o.kind == "flag":
        return "True" if o.default else "False"
    if o.kind == "str":
        return '"' + o.default + '"'
    return repr(o.default)


def _skips(k: Kernel, pass_: str) -> bool:
    """Whether the op of `pass_` takes ``skip`` (the gradients left out): a backward or fused op of
    a kernel that declares skippable gradients."""
    return pass_ != "forward" and bool(k.skippable)


def _arg_names(k: Kernel, pass_: str) -> List[str]:
    """The op's arguments: required tensors, optional tensors, options, implementation, memory_budget
    (and skip, see _skips)."""
    tensors = list(k.inputs) + (list(k.grad_inputs) if pass_ == "backward" else [])
    return ([t.name for t in tensors if t.required] + [t.name for t in tensors if not t.required] +
            [o.name for o in k.options] + ["implementation", "memory_budget"] + (["skip"] if _skips(k, pass_) else []))


def _schema(k: Kernel, pass_: str) -> str:
    tensors = list(k.inputs) + (list(k.grad_inputs) if pass_ == "backward" else [])
    args = [f"Tensor {t.name}" for t in tensors if t.required]
    args += [f"Tensor? {t.name}=None" for t in tensors if not t.required]
    args += [f"{_SCHEMA_TYPES[o.kind]} {o.name}={_default_literal(o)}" for o in k.options]
    args += ['str implementation=""', "int memory_budget=0"] + (['str skip=""'] if _skips(k, pass_) else [])
    return "(" + ", ".join(args) + ") -> Tensor[]"


def _defaults(k: Kernel) -> Dict[str, Any]:
    d: Dict[str, Any] = {t.name: None for t in list(k.inputs) + list(k.grad_inputs) if not t.required}
    d.update({o.name: o.default for o in k.options})
    d["implementation"] = ""
    d["memory_budget"] = 0
    d["skip"] = ""  # the gradients left out, comma-joined (an op schema takes no str[] default)
    return d


def _split(k: Kernel, pass_: str, args, kwargs):
    # The dispatcher may leave out trailing arguments that equal their defaults.
    named = _defaults(k)
    named.update(zip(_arg_names(k, pass_), args))
    named.update(kwargs)
    tensor_names = [t.name for t in k.inputs] + ([t.name for t in k.grad_inputs] if pass_ == "backward" else [])
    tensors = {n: widen_mask(named[n]) for n in tensor_names if named[n] is not None}
    options = k.option_texts({o.name: named[o.name] for o in k.options})
    return (tensors, options, named["implementation"], memory_budget_bytes(named["memory_budget"], k.name),
            _skip_list(named["skip"]))


def _skip_list(text: str) -> List[str]:
    """"dx,dw" -> ["dx", "dw"] (the ops take the gradients left out as one comma-joined string)."""
    return [n for n in text.split(",") if n] if text else []


_FALLBACK_SIZE = 64  # the value tried for a size with no hint (an unbacked, data-dependent one)
_STEP = 64  # how far a probe moves a size (a multiple of every alignment a spec asks for)


def _symbols(tensors: Dict[str, torch.Tensor]):
    """The free symbols of the tensors' symbolic sizes and strides, each with its hint (the value
    in the example being traced; _FALLBACK_SIZE for an unbacked one): {} without dynamic shapes."""
    out = {}
    for t in tensors.values():
        for d in (*t.shape, *t.stride()):
            if isinstance(d, torch.SymInt):
                for sym in d.node.expr.free_symbols:
                    if sym not in out:
                        env = d.node.shape_env
                        h = getattr(env, "backed_var_to_val", None)  # torch >= 2.15; var_to_val before
                        h = (h if h is not None else env.var_to_val).get(sym)
                        out[sym] = int(h) if h is not None else _FALLBACK_SIZE
    return out


def _value(d, point) -> int:
    """A size at a point (the value of every free symbol); a plain int is itself. No guard."""
    return int(d.node.expr.xreplace(point)) if isinstance(d, torch.SymInt) else int(d)


def _metas(tensors: Dict[str, torch.Tensor], point=None) -> Dict[str, Any]:
    """The C++ spec's view of the tensors (dtype, shape, strides), sizes and strides evaluated at
    `point` (default: the hints; a probe moves them, _symbolic_shapes)."""
    point = _symbols(tensors) if point is None else point
    if not point:   # concrete sizes (eager): read as they are
        return {n: (dtype_name(t.dtype), list(t.shape), list(t.stride())) for n, t in tensors.items()}
    return {n: (dtype_name(t.dtype), [_value(d, point) for d in t.shape], [_value(st, point) for st in t.stride()])
            for n, t in tensors.items()}


def _permuted_strides(shape, like):
    """Contiguous strides of `shape` in the dimension order of strides `like` (the largest first);
    sizes may be symbolic."""
    order = sorted(range(len(shape)), key=lambda i: -like[i])
    strides, acc = [0] * len(shape), 1
    for i in reversed(order):
        strides[i] = acc
        acc = acc * shape[i]
    return strides


def _descs(k: Kernel, pass_: str, tensors: Dict[str, torch.Tensor], options: Dict[str, str], skip=()):
    """[(name, dtype, shape, strides)] of the pass's outputs; under dynamic shapes each output size
    that is an input's symbolic size is that size (_symbolic_shapes), so one compiled graph serves
    every size instead of recompiling per shape."""
    tensors = {n: widen_mask(t) for n, t in tensors.items()}
    point = _symbols(tensors)
    descs = _ext.outputs(k.name, pass_, _metas(tensors, point), options, list(skip))
    if not point:
        return descs
    return _symbolic_shapes(k, pass_, tensors, options, skip, descs)


def _probe_points(base):
    """Where the spec is asked again: each symbol moved alone, all moved by one step (sizes that must
    stay related, N and N + 1, move together), all moved by different steps."""
    syms = list(base)
    points = [{**base, s: base[s] + _STEP} for s in syms]
    points.append({s: v + _STEP for s, v in base.items()})
    if len(syms) > 1:
        points.append({s: v + _STEP * (i + 2) for i, (s, v) in enumerate(base.items())})
    return points


def _symbolic_shapes(k: Kernel, pass_: str, tensors, options, skip, descs):
    """Output sizes as the inputs' symbolic sizes. The spec (which sees only numbers) is asked again
    at probe points, each symbol at another value; an output size is an input size (a symbol or an
    expression such as B·T − B) when it equals that size at the hints and at every point the spec
    accepts. Contract (registry.h, CallSpec::outputs): every output size is an input's size or a
    constant. Two input sizes that match alike (no accepted point moved one without the other: the
    spec requires them equal) are declared equal (torch._check). A size that matches no input size
    and changes, or a symbol that no accepted point moved, specializes every input size (int():
    guards, so a new value recompiles, as before) — never a wrong shape."""
    base = _symbols(tensors)
    probes = []
    for point in _probe_points(base):
        try:
            probes.append((point, _ext.outputs(k.name, pass_, _metas(tensors, point), options, list(skip))))
        except (ValueError, TypeError, NotImplementedError):
            continue  # a size relation the spec enforces (N and N + 1 apart): another point moves them together
    moved = {s for point, _ in probes for s in base if point[s] != base[s]}
    sizes = {}  # input size expression -> (SymInt, its values at the hints and the accepted points)
    for t in tensors.values():
        for d in t.shape:
            if isinstance(d, torch.SymInt) and d.node.expr not in sizes:
                sizes[d.node.expr] = (d, [_value(d, base)] + [_value(d, pt) for pt, _ in probes])
    layout = [(len(sh), name) for name, _, sh, _ in descs]
    if moved != set(base) or any([(len(p[2]), p[0]) for p in out] != layout for _, out in probes):
        return _specialized(tensors, descs)
    result = []
    for i, (name, dt, sh, st) in enumerate(descs):
        shape = []
        for j, v in enumerate(sh):
            seen = [v] + [out[i][2][j] for _, out in probes]
            match = [d for d, vals in sizes.values() if vals == seen]
            if not match and len(set(seen)) > 1:
                return _specialized(tensors, descs)
            for other in match[1:]:  # sizes no accepted point told apart (x's rows and the labels'):
                torch._check(other == match[0])  # the spec requires them equal; torch checks it at run time
            shape.append(match[0] if match else v)
        result.append((name, dt, shape, st))
    return result


def _specialized(tensors, descs):
    """Every symbolic input size specialized to its hint (a guard each): the descs hold then."""
    for t in tensors.values():
        for d in t.shape:
            if isinstance(d, torch.SymInt):
                int(d)
    return descs


def _alloc(descs, dev: torch.device) -> List[torch.Tensor]:
    """The outputs the descs describe, laid out as their strides say (a permutation of a contiguous
    layout: dw in w's layout); symbolic sizes get the same layout's symbolic strides."""
    out = []
    for _, d, shape, strides in descs:
        if any(isinstance(v, torch.SymInt) for v in shape):
            strides = _permuted_strides(shape, strides)
        out.append(torch.empty_strided(shape, strides, dtype=_TORCH[d], device=dev))
    return out


def _views(k: Kernel, tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The call's views: detached (DLPack refuses tensors that require grad); the inputs the
    kernel reads on the host (group sizes, page tables, lengths) copied there from a GPU."""
    host = {i.name for i in k.inputs if i.host_only}
    return {n: (t.detach().cpu() if n in host else t.detach()) for n, t in tensors.items()}


_to_dlpack = torch.utils.dlpack.to_dlpack


_F8 = getattr(torch, "float8_e4m3fn", None)


def _capsules(views: Dict[str, torch.Tensor]):
    """DLPack capsules of the call's tensors: torch.utils.dlpack.to_dlpack (C, ~0.6 µs) instead of
    each tensor's __dlpack__ (Python, ~3 µs, with a stream handshake the call does not need: the
    kernel runs on the stream that produced its inputs, the caller's current one). A float8_e4m3fn
    tensor crosses as its uint8 bits (older PyTorch refuses float8 in DLPack), named in the second
    value: the extension's ml_bits."""
    caps, bits = {}, set()
    for n, t in views.items():
        if t.dtype is _F8:
            t = t.view(torch.uint8)
            bits.add(n)
        caps[n] = _to_dlpack(t)
    return caps, bits


def _device(tensors: Dict[str, torch.Tensor]) -> torch.device:
    return next(iter(tensors.values())).device


def _register(k: Kernel, pass_: str, op_name: str):
    _lib.define(op_name + _schema(k, pass_), tags=_TAGS)

    def impl(*args, **kwargs):
        tensors, options, implementation, budget, skip = _split(k, pass_, args, kwargs)
        dev = _device(tensors)
        outs = _alloc(_descs(k, pass_, tensors, options, skip), dev)
        stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
        views = _views(k, tensors)
        caps, bits = _capsules(views)
        _ext.call(k.name, pass_, caps, [_to_dlpack(o) for o in outs], options, implementation, 0, stream,
                  memory_budget=budget, skip=skip, ml_bits=bits)
        return outs

    def fake(*args, **kwargs):
        tensors, options, _, _, skip = _split(k, pass_, args, kwargs)
        dev = _device(tensors)
        return _alloc(_descs(k, pass_, tensors, options, skip), dev)

    for key in ("CPU", "CUDA"):
        _lib.impl(op_name, impl, key)
    torch.library.register_fake("tessera::" + op_name, fake, lib=_lib)
    _IMPLS[op_name] = impl


# The ops' Python implementations by op name: what the dispatcher calls for CPU and CUDA tensors.
_IMPLS: Dict[str, Any] = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_eager(tensors) -> bool:
    """Whether a forward call may skip PyTorch's dispatcher (~25–50 µs of a small call) and run the
    op's implementation directly: eager, no gradient to record, plain dense tensors, and nothing
    that must see the op — no torch.compile or TorchScript tracing (a traced graph would hold no
    call), no dispatch or torch-function mode (fake tensors, `with torch.device(...)`, logging
    modes), no profiler (the op stays in its traces); no tensor whose dispatch keys do work before
    a kernel (a negative or conjugate bit, a functionalization wrapper) or that is not strided."""
    if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None or
            torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled() or
            torch.autograd._profiler_enabled()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if (type(t) not in _PLAIN or (grad and t.requires_grad) or t.device.type not in ("cpu", "cuda") or
                t.layout is not torch.strided or t.is_nested or t.is_neg() or t.is_conj() or
                torch._is_functional_tensor(t)):
            return False
    return True


def _direct(op, impl, n_tensors: int):
    """The forward op, called through the dispatcher unless _plain_eager allows its implementation
    directly (the same outputs: the dispatcher would call the same function with the same args).
    A kernel registered over the op later (torch.library.register_kernel) is seen by
    torch.ops.tessera.<kernel>, not by this direct path."""
    def call(*args):
        return impl(*args) if _plain_eager(args[:n_tensors]) else op(*args)
    return call


def _register_autograd(k: Kernel):
    fwd_names = _arg_names(k, "forward")
    bwd_names = _arg_names(k, "backward")
    diff = [t.name for t in k.inputs if t.differentiable]
    bwd_op = getattr(torch.ops.tessera, k.name + "_backward")

    def setup_context(ctx, inputs, output):
        named = _defaults(k)
        named.update(zip(fwd_names, inputs))
        tensor_names = [t.name for t in k.inputs if named[t.name] is not None]
        ctx.tensor_names = tensor_names
        ctx.rest = {n: v for n, v in named.items() if n not in tensor_names}
        # Forward outputs are ordered: forward_outputs, then the saved-only ones, then the others.
        nf = len(k.forward_outputs)
        order = k.forward_order
        saved = [output[order.index(n)] for n in k.saved_outputs]
        ctx.save_for_backward(*[named[n] for n in tensor_names], *saved)
        ctx.grad_shapes = [o.shape for o in output[:nf]]
        ctx.grad_dtypes = [o.dtype for o in output[:nf]]
        # The names of every output, in order (the optional ones depend on the options).
        tensors = {n: named[n] for n in tensor_names}
        options = k.option_texts({o.name: named[o.name] for o in k.options})
        metas = _metas({n: widen_mask(t) for n, t in tensors.items()})
        ctx.out_names = [d[0] for d in _ext.outputs(k.name, "forward", metas, options)]
        # forward_outputs take a gradient, and the outputs whose grad_<name> the backward declares
        # (last states); the saved-only ones (lse) and the others (argmax, z_loss) do not pretend to.
        # A forward-only kernel marks none: a gradient through any output is an error (backward).
        ctx.mark_non_differentiable(*[o for i, o in enumerate(output)
                                      if i >= nf and not k.takes_grad(ctx.out_names[i]) and not k.forward_only])

    def backward(ctx, *grads):
        if k.forward_only:  # a zero or missing gradient would hide that none exists
            raise RuntimeError(k.no_gradient("call it under torch.no_grad() or .detach() its inputs"))
        _first_order_only(k)
        if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
            grads = grads[0]
        saved = ctx.saved_tensors
        n = len(ctx.tensor_names)
        named: Dict[str, Any] = dict(ctx.rest)
        named.update(zip(ctx.tensor_names, saved[:n]))
        named.update(zip(k.saved_outputs, saved[n:]))
        for name, g, shape, dtype in zip(k.forward_outputs, grads, ctx.grad_shapes, ctx.grad_dtypes):
            ref = saved[0]
            # In its output's dtype (the kernels take "f32 or the inputs' dtype", and an output is
            # one of them: attention's bf16 dO keeps the cpu backward on its bf16 dot route), else f32.
            named["grad_" + name] = (torch.zeros(shape, dtype=torch.float32, device=ref.device) if g is None
                                     else g.to(dtype if g.dtype == dtype else torch.float32).contiguous())
        for name, g in zip(ctx.out_names[len(k.forward_outputs):], grads[len(k.forward_outputs):]):
            if g is not None and k.takes_grad(name):  # optional upstream gradients (last states)
                named["grad_" + name] = g.to(torch.float32).contiguous()
        for t in k.grad_inputs:
            named.setdefault(t.name, None)
        skip = _unwanted(k, diff, named, fwd_names, ctx.needs_input_grad)
        if _skips(k, "backward"):
            named["skip"] = ",".join(skip)
        outs = bwd_op(*[named[a] for a in bwd_names])
        by_name = {}
        i = 0
        for name in diff:  # backward writes d<input> for each differentiable input given and not skipped, in order
            if named.get(name) is not None and "d" + name not in skip:
                by_name[name] = outs[i]
                i += 1
        # One gradient per argument the caller gave: PyTorch 2.11 checks the count against them
        # (trailing defaults left out); setup_context's inputs are always all of them, with the
        # defaults filled in, so they cannot tell.
        return tuple(by_name.get(a) if a in diff else None for a in fwd_names[:len(ctx.needs_input_grad)])

    torch.library.register_autograd("tessera::" + k.name, backward, setup_context=setup_context, lib=_lib)


def _first_order_only(k: Kernel) -> None:
    """Inside a backward: autograd records it only for a second derivative (create_graph=True, a
    gradient penalty, a Hessian-vector product). The backward ops have no autograd formula, so
    PyTorch would treat them as constants and return a wrong second derivative: refused."""
    if torch.is_grad_enabled():
        raise RuntimeError(k.no_second_order())


def _unwanted(k: Kernel, diff, named, fwd_names, needs_input_grad) -> List[str]:
    """The gradients d<input> that autograd does not ask for (a frozen weight: needs_input_grad
    False) and the kernel can skip: the backward leaves them out and skips their work."""
    def needed(name):
        i = fwd_names.index(name)
        return i < len(needs_input_grad) and needs_input_grad[i]
    return [("d" + n) for n in diff if named.get(n) is not None and ("d" + n) in k.skippable and not needed(n)]


def _register_fused(k: Kernel, op_name: str):
    """The fused pass as an op with the forward's schema: it runs forward and backward at once with
    an upstream gradient of 1 and returns the forward's outputs, then d<input> for each
    differentiable input given. Its backward scales those saved gradients by the upstream one.

    An f16 input's saved gradient is held in f32 (the kernel writes it so) and rounded to f16 after
    the scaling: at an upstream gradient of 1 a mean loss's small gradients sit in f16's subnormal
    range (below 6.1e-5: 2^-24 absolute steps, 0 below 3e-8), which GradScaler's loss scale exists
    to avoid; scaled afterwards, the lost digits would not come back. bf16 has f32's range: kept."""
    _lib.define(op_name + _schema(k, "fused"), tags=_TAGS)
    grad_names = {"d" + t.name for t in k.inputs if t.differentiable}

    def fused_args(args, kwargs):
        tensors, options, implementation, budget, skip = _split(k, "fused", args, kwargs)
        dev = _device(tensors)
        tensors["grad_loss"] = torch.ones((), dtype=torch.float32, device=dev)
        descs = [(n, "f32" if n in grad_names and d == "f16" else d, sh, st)
                 for n, d, sh, st in _descs(k, "fused", tensors, options, skip)]
        outs = _alloc(descs, dev)
        return tensors, options, implementation, budget, skip, dev, outs

    def impl(*args, **kwargs):
        tensors, options, implementation, budget, skip, dev, outs = fused_args(args, kwargs)
        stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
        views = _views(k, tensors)
        caps, bits = _capsules(views)
        _ext.call(k.name, "fused", caps, [_to_dlpack(o) for o in outs], options, implementation, 0, stream,
                  memory_budget=budget, skip=skip, ml_bits=bits)
        return outs

    def fake(*args, **kwargs):
        return fused_args(args, kwargs)[-1]

    for key in ("CPU", "CUDA"):
        _lib.impl(op_name, impl, key)
    torch.library.register_fake("tessera::" + op_name, fake, lib=_lib)

    fwd_names = _arg_names(k, "fused")
    diff = [t.name for t in k.inputs if t.differentiable]

    def setup_context(ctx, inputs, output):
        named = dict(zip(fwd_names, inputs))
        skip = _skip_list(named.get("skip") or "")
        ctx.given = [n for n in diff if named.get(n) is not None and "d" + n not in skip]
        ctx.dtypes = {n: named[n].dtype for n in ctx.given}  # an f16 input's gradient is held in f32
        grads = output[len(output) - len(ctx.given):]
        ctx.save_for_backward(*grads)
        ctx.mark_non_differentiable(*output[1:])  # only the loss takes a gradient (the spec's forward_outputs)

    def backward(ctx, *grads):
        _first_order_only(k)
        if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
            grads = grads[0]
        g = grads[0]
        saved = dict(zip(ctx.given, ctx.saved_tensors))
        given = fwd_names[:len(ctx.needs_input_grad)]  # one gradient per argument given (as above)
        if g is None:
            return tuple(None for _ in given)
        one = _is_one(g)
        saved = {n: d.to(ctx.dtypes[n]) if one else _scaled(d, g, ctx.dtypes[n]) for n, d in saved.items()}
        return tuple(saved.get(a) for a in given)

    torch.library.register_autograd("tessera::" + op_name, backward, setup_context=setup_context, lib=_lib)


def _scaled(d: torch.Tensor, g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A saved gradient times the upstream scalar, in f32 and rounded once to `dtype` (its input's;
    d is that dtype, or f32 for an f16 input). On a CUDA device a 16-bit tensor times a 0-d f32
    tensor computes in the 16-bit type (g rounded to bf16 first: up to 2^-9 off for g = 0.1); a
    Python float is kept in f32 by the kernel. While tracing the value is unknown: an f32 product
    that the compiler fuses into one pass."""
    if _traced(g):
        return (d.to(torch.float32) * g.to(torch.float32)).to(dtype)
    return (d * float(g)).to(dtype)


def _traced(g: torch.Tensor) -> bool:
    """Whether anything traces g (torch.compile, make_fx, opcheck: a dispatch mode is active, or g
    is a tensor subclass or a functorch wrapper): its value must not be read or baked in."""
    return (torch.compiler.is_compiling() or type(g) is not torch.Tensor or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._functorch.is_functorch_wrapped_tensor(g))


def _is_one(g: torch.Tensor) -> bool:
    """Whether the upstream gradient is known to be exactly 1 (then the saved gradients are returned
    as they are; a multiply by 1.0 would not change a bit but costs a pass over dw). While
    anything traces (torch.compile, make_fx, opcheck: a dispatch mode is active or g is a tensor
    subclass or a functorch wrapper) the value is unknown or must not be baked in: multiply."""
    return not _traced(g) and bool(g == 1)


def _autocast(*tensors):
    """Under torch.autocast for the tensors' device, the floating ones in its dtype (a kernel's
    matmul operands, as autocast casts torch.matmul's: a bf16 x with an f32 lm_head.weight); the
    cast is differentiable, so an f32 parameter's gradient comes back in f32. Else unchanged."""
    first = next((t for t in tensors if t is not None), None)
    if first is None or not torch.is_autocast_enabled(first.device.type):
        return tensors
    dt = torch.get_autocast_dtype(first.device.type)
    return tuple(t.to(dt) if t is not None and t.is_floating_point() and t.dtype != dt else t for t in tensors)


try:  # a contiguity test that never guards: False when a size is unknown (unbacked) under compile
    from torch._prims_common import is_contiguous_or_false as _symbolic_contiguous
except ImportError:  # older torch
    def _symbolic_contiguous(t):
        return t.is_contiguous()


def _contiguous(t) -> bool:
    """t.is_contiguous() (C++, ~0.1 µs) for concrete sizes; the guard-free Python test under
    torch.compile (dynamo's tracing of an isinstance on an unbacked size is no test) or where a size
    or stride is symbolic (fake tracing). In eager it cost ~20 µs per call of six inputs."""
    if torch.compiler.is_compiling() or any(isinstance(d, torch.SymInt) for d in (*t.shape, *t.stride())):
        return _symbolic_contiguous(t)
    return t.is_contiguous()


def _dense(t, transposed: bool = False):
    """An input as the kernels read it: contiguous (a strided view, such as q split off a fused qkv
    projection or hidden[:, :-1], is copied once, as FlashAttention's and Liger's wrappers do; the
    copy is differentiable, so gradients reach the view). A 2-D transposed view of a contiguous
    array is kept where the kernel reads it in place (`transposed`: linear_cross_entropy's w).
    Under torch.compile with unbacked sizes, a tensor whose layout cannot be decided is copied
    (t.is_contiguous() would need a guard on a data-dependent size and fail)."""
    if t is None or not isinstance(t, torch.Tensor) or _contiguous(t):
        return t
    if transposed and t.dim() == 2 and _contiguous(t.t()):
        return t
    return t.contiguous()


def _no_functorch(kernel: str):
    """torch.func transforms (grad, vmap, jacrev, ...) cannot transform these ops: their autograd
    is torch.library.register_autograd's, an autograd.Function without setup_context, and they
    register no vmap rule. Said by name instead of PyTorch's message about setup_context (as
    FlashAttention's and Liger's autograd.Functions, the same limit)."""
    if torch.compiler.is_compiling():
        return
    peek = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
    if peek is not None and peek() is not None:
        raise RuntimeError(f"tessera.torch.{kernel}: torch.func transforms (grad, vmap, jacrev, ...) are not "
                           "supported; differentiate with .backward() or torch.autograd.grad (torch.func."
                           "functional_call alone works)")


def _int_options(kernel: str, **values):
    for name, v in values.items():
        if isinstance(v, bool):
            raise TypeError(f"{kernel}: {name} must be an int, got bool")


def _draw_seed(ref):
    """A Philox key (i32 [2]) from torch's default generator of ref's device: torch.manual_seed
    makes the draw, hence the dropout mask, reproducible; each call draws a new one."""
    return torch.randint(-2 ** 31, 2 ** 31 - 1, (2,), dtype=torch.int32, device=ref.device)


def _make(k: Kernel, op=None, drop_grads=False):
    """The user-facing function, generated as Python source so that torch.compile traces it.
    With `drop_grads` (the fused op) the trailing d<input> outputs are left out, and `_skip` names
    the gradients the op leaves out (the fused op's ``skip``)."""
    req = [t.name for t in k.inputs if t.required]
    opt = [t.name for t in k.inputs if not t.required]
    params = req + ["*"] + [f"{n}=None" for n in opt] + [f"{o.name}={o.default!r}" for o in k.options]
    params += [f"{f}=False" for f in k.saved_flags] + ["implementation=None", "memory_budget=None"]
    call_args = req + opt + [f"float({o.name} or 0.0)" if o.kind == "float" else o.name for o in k.options]
    call_args += ['implementation or ""', f"_budget(memory_budget, {k.name!r})"]
    if drop_grads:
        params.append("_skip=()")
        call_args.append('",".join(_skip)')
    nf, ns = len(k.forward_outputs), len(k.saved_only)
    diff = [t.name for t in k.inputs if t.differentiable]
    drop = (f"    outs = outs[:len(outs) - sum(t is not None for t in ({', '.join(diff)},)) + len(_skip)]\n"
            if drop_grads else "")
    cast = [t.name for t in k.inputs if t.autocast]
    cast_line = f"    {', '.join(cast)}, = _autocast({', '.join(cast)})\n" if cast else ""
    # An int option given a bool (ignore_index=True) is refused, as in NumPy and JAX: the op's
    # schema took it as 1.
    ints = [o.name for o in k.options if o.kind == "int"]
    ints_line = (f"    _int_options({k.name!r}, {', '.join(f'{n}={n}' for n in ints)})\n" if ints else "")
    # A random key the caller left out (dropout_seed) is drawn from torch's generator, on the
    # first input's device, when its option (dropout_p) asks for one.
    seed_lines = "".join(f"    if {t.name} is None and {t.seed_of}:\n        {t.name} = _draw_seed({req[0]})\n"
                         for t in k.inputs if t.seed_of)
    dense_line = (f"    {', '.join(t.name for t in k.inputs)}, = "
                  f"{', '.join(f'_dense({t.name}, {t.transposed})' for t in k.inputs)},\n")
    src = (f"def {k.name}({', '.join(params)}):\n" + f"    _no_functorch({k.name!r})\n" + ints_line + cast_line +
           seed_lines + dense_line +
           f"    outs = _op({', '.join(call_args)})\n" + drop +
           f"    public = list(outs[:{nf}]) + list(outs[{nf + ns}:])\n"
           + "".join(f"    if {f}:\n        public.append(outs[{nf + i}])\n" for i, f in enumerate(k.saved_flags)) +
           f"    return public[0] if len(public) == 1 else tuple(public)\n")
    forward_op = _direct(getattr(torch.ops.tessera, k.name), _IMPLS[k.name], len(req) + len(opt))
    scope = {"_op": op or forward_op, "_budget": memory_budget_bytes, "_autocast": _autocast,
             "_int_options": _int_options, "_dense": _dense, "_no_functorch": _no_functorch, "_draw_seed": _draw_seed}
    exec(src, scope)  # noqa: S102 - source built from the registry's names only
    fn = scope[k.name]
    fn.__doc__ = k.doc("PyTorch custom op with autograd; torch.compile-able") + k.returns_doc()
    fn.__module__ = __name__
    return fn


for _k in KERNELS.values():
    _register(_k, "forward", _k.name)
    _register(_k, "backward", _k.name + "_backward")
    _register_autograd(_k)
    globals()[_k.name] = _make(_k)
del _k


_single_device_linear_cross_entropy = linear_cross_entropy  # noqa: F821 - generated above
_register_fused(KERNELS["linear_cross_entropy"], "linear_cross_entropy_fused")
_fused_linear_cross_entropy = _make(KERNELS["linear_cross_entropy"], torch.ops.tessera.linear_cross_entropy_fused,
                                    drop_grads=True)


def _fused_in_forward(x, w, kwargs) -> bool:
    """A scalar loss (sum / mean) whose gradient will be asked for: run the fused pass now."""
    if kwargs.get("reduction", "mean") not in ("sum", "mean") or not torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in (x, w, kwargs.get("bias")))


def _frozen(x, w, bias) -> List[str]:
    """The gradients the fused pass leaves out: those of x, w and bias that do not require grad (a
    frozen lm_head under LoRA: no dw GEMM, no dw buffer held until the backward)."""
    return [d for d, t in (("dx", x), ("dw", w), ("dbias", bias)) if t is not None and not t.requires_grad]


def linear_cross_entropy(x, w, labels, *, vocab_start=None, process_group=None, **kwargs):
    kwargs = canonical_keywords("linear_cross_entropy", kwargs)  # soft_cap= still works
    if kwargs.get("vocab_total"):
        raise ValueError("linear_cross_entropy: pass vocab_start= and process_group= for a vocab-parallel loss; "
                         "vocab_total is the kernel's partial form, which tessera.parallel.torch drives")
    if vocab_start is None and process_group is None:
        if _fused_in_forward(x, w, kwargs):
            return _fused_linear_cross_entropy(x, w, labels, _skip=_frozen(x, w, kwargs.get("bias")), **kwargs)
        return _single_device_linear_cross_entropy(x, w, labels, **kwargs)
    from .parallel.torch import vocab_parallel_linear_cross_entropy
    x, w = _autocast(x, w)
    if kwargs.get("bias") is not None:
        kwargs["bias"], = _autocast(kwargs["bias"])
    return vocab_parallel_linear_cross_entropy(x, w, labels, vocab_start=vocab_start or 0, group=process_group, **kwargs)


linear_cross_entropy.__doc__ = (_single_device_linear_cross_entropy.__doc__ or "") + """

With reduction "sum" or "mean", grad mode on and x, w or bias requiring grad, the forward runs
the fused pass (as Liger-Kernel does): loss and dx / dw / dbias at once with an upstream gradient
of 1 (no second pass that recomputes the logits); the backward returns them scaled by the upstream
gradient (as they are when it is 1). The gradients are therefore allocated in the forward and held
until the backward (x's, w's and bias's sizes). A gradient whose input does not require grad (a
frozen lm_head.weight) is neither computed nor held: its GEMM is skipped (on the cpu backend; cuda
computes it into scratch for now), in both this fused form and the backward pass. reduction="none", torch.no_grad() or inputs that
do not require grad run the forward pass alone and the backward pass in backward().

Vocab-parallel (docs/DISTRIBUTED.md): with ``vocab_start=s, process_group=pg`` w holds classes
[s, s + V_local) of the classifier on this rank (bias and class_weights the matching slices; x,
labels, token_weights the same on every rank); the loss and gradients equal one device's."""


class LinearCrossEntropyLoss(torch.nn.Module):
    """Fused linear + cross-entropy loss with Liger-Kernel's call signature.

    ``LigerFusedLinearCrossEntropyLoss(...)(lin_weight, _input, target, bias=None)`` becomes
    ``tessera.torch.LinearCrossEntropyLoss(...)(lin_weight, _input, target, bias=None)``:
    lse_square_scale -> z_loss_weight, softcap (None = off) -> softcap, ce_weight -> class_weights
    (PyTorch's weight=, with label smoothing too; a buffer, so ``.to()`` and ``state_dict`` carry
    it). ``ce_weight`` with ``lse_square_scale > 0`` is refused: Liger leaves its z-loss unweighted
    and averages it over tokens, Tessera weights it like the loss. With ``return_z_loss`` or
    ``return_token_accuracy`` the call returns ``(loss, z_loss, token_accuracy)`` (None for the one
    not asked for; both metrics carry no gradient), the tuple form Liger's results unpack from;
    ``token_weights`` (per token) is Tessera's.
    """

    def __init__(self, ce_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 lse_square_scale: float = 0.0, label_smoothing: float = 0.0, reduction: str = "mean",
                 softcap: Optional[float] = None, return_z_loss: bool = False,
                 return_token_accuracy: bool = False, implementation: Optional[str] = None,
                 memory_budget: Optional[int] = None):
        super().__init__()
        self.return_z_loss = return_z_loss
        self.return_token_accuracy = return_token_accuracy
        if ce_weight is not None and lse_square_scale > 0:
            raise NotImplementedError(
                "ce_weight with lse_square_scale > 0: Liger's z-loss is not class-weighted, tessera's is "
                "(z_loss_weight scales weight[label]·lse²); use tessera.torch.linear_cross_entropy with "
                "class_weights= and z_loss_weight= for tessera's definition")
        self.register_buffer("ce_weight", None if ce_weight is None else ce_weight.detach().float())
        self.ignore_index = ignore_index
        self.lse_square_scale = lse_square_scale
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.softcap = softcap
        self.implementation = implementation
        self.memory_budget = memory_budget_bytes(memory_budget, "LinearCrossEntropyLoss")

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None, token_weights: Optional[torch.Tensor] = None):
        out = linear_cross_entropy(  # noqa: F821 - generated above
            _input, lin_weight, target, bias=bias, token_weights=token_weights,
            class_weights=None if self.ce_weight is None else self.ce_weight.float(),  # .bfloat16() moves buffers too
            reduction=self.reduction,
            ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
            z_loss_weight=self.lse_square_scale, softcap=self.softcap or 0.0, implementation=self.implementation,
            memory_budget=self.memory_budget or None, return_z_loss=self.return_z_loss, return_token_accuracy=self.return_token_accuracy)
        if not (self.return_z_loss or self.return_token_accuracy):
            return out
        rest = list(out[1:])
        z_loss = rest.pop(0) if self.return_z_loss else None
        accuracy = rest.pop(0) if self.return_token_accuracy else None
        return out[0], z_loss, accuracy

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, lse_square_scale={self.lse_square_scale}, "
                f"label_smoothing={self.label_smoothing}, reduction={self.reduction!r}, softcap={self.softcap}"
                + (f", implementation={self.implementation!r}" if self.implementation else "")
                + (f", memory_budget={self.memory_budget}" if self.memory_budget else ""))


def _sdpa_bias(attn_mask, is_causal: bool, L: int, S: int, dtype: torch.dtype, device) -> Optional[torch.Tensor]:
    """SDPA's attn_mask (bool: True takes part; float: added to the scores) and its top-left
    is_causal for L != S as tessera's bias [B|1, H|1, L|1, S|1] (−inf where masked), or None."""
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=dtype, device=device).masked_fill(~attn_mask, float("-inf"))
        else:
            bias = attn_mask
        if bias.dim() > 4:
            raise ValueError(f"attn_mask must broadcast to [B, H, L, S], got {tuple(bias.shape)}")
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if is_causal and L != S:  # SDPA aligns its causal mask top-left: key j <= query i
        keep = torch.ones(L, S, dtype=torch.bool, device=device).tril()
        bias = torch.zeros(1, 1, L, S, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
    return bias


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, **kwargs):
    """``torch.nn.functional.scaled_dot_product_attention``'s call on tessera's attention kernel.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (or without B) -> [B, Hq, L, Ev].
    attn_mask: bool (True takes part) or float (added to the scores; its gradient flows when it
    requires grad), broadcastable to [B, Hq, L, S] with each dim 1 or full; is_causal aligned
    top-left as SDPA's (for L != S it becomes a bias [1, 1, L, S]); GQA needs enable_gqa=True, as
    SDPA (one kv head broadcasts without it). Not taken: other ranks than 3 and 4, a key batch of 1
    broadcast over the queries'. dropout_p draws its seed from torch's generator (tessera's Philox mask, not SDPA's).
    Differences: a row whose keys are all masked gives 0 (SDPA's math backend gives NaN); inputs are
    read in tessera's [B, L, H, E] layout (a transposed copy of SDPA's layout, once per call).
    Other keywords (implementation=, block_sizes=, deterministic=, softcap=, ...) go to
    ``tessera.torch.attention``."""
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError("scaled_dot_product_attention: query, key, value must all be [B, H, L, E] or [H, L, E], got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: attn_mask and is_causal=True together (SDPA refuses it too)")
    three = query.dim() == 3
    if three:
        query, key, value = (t.unsqueeze(0) for t in (query, key, value))
    if query.shape[1] != key.shape[1] and key.shape[1] != 1 and not enable_gqa:  # one kv head broadcasts, as SDPA's
        raise ValueError(f"scaled_dot_product_attention: {query.shape[1]} query heads and {key.shape[1]} kv heads "
                         "need enable_gqa=True (as SDPA)")
    L, S = query.shape[2], key.shape[2]
    bias = _sdpa_bias(attn_mask, is_causal, L, S, query.dtype, query.device)
    if scale is not None and scale <= 0:  # the kernel takes a scale > 0: 0 scores every key alike, < 0 flips q
        query, scale = (query * 0, 1.0) if scale == 0 else (-query, -scale)
    o = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),  # noqa: F821 - generated
                  bias=bias, causal=is_causal and L == S, scale=scale, dropout_p=dropout_p, **kwargs)
    o = o.transpose(1, 2)
    return o.squeeze(0) if three else o
