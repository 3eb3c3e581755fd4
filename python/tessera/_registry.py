"""The kernel registry as Python sees it, and the generic call machinery.

Everything here is generated from ``tessera._ext.kernels()`` (the C++ KernelSpec's CallSpec):
the inputs a kernel takes (required / optional / differentiable), its options (kind, default,
choices), its passes and which forward outputs take an upstream gradient. The NumPy, PyTorch and
JAX front ends build their per-kernel functions from a ``Kernel`` and never name a kernel.

Conventions of a CallSpec that the front ends rely on:
  * backward takes the forward's inputs, ``grad_<out>`` for each output in ``forward_outputs``
    and, optionally, each output in ``saved_outputs`` (e.g. ``lse``; an output may be both a
    forward output and saved, like attention's ``o``);
  * backward writes ``d<input>`` for each differentiable input that was given.
"""
from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _ext

# DLPack / framework dtype names -> Tessera's.
_DTYPE_NAMES = {
    "float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32", "int64": "i64",
    "torch.float32": "f32", "torch.bfloat16": "bf16", "torch.float16": "f16",
    "torch.int32": "i32", "torch.int64": "i64",
    "float8_e4m3fn": "f8e4m3", "torch.float8_e4m3fn": "f8e4m3",  # a storage type (paged_attention's caches)
}


_MASK_DTYPES = ("bool", "uint8", "torch.bool", "torch.uint8")

_DTYPE_TEXT: Dict[Any, str] = {}


def dtype_text(dtype: Any) -> str:
    """str(dtype), remembered per dtype object: NumPy's str of a dtype costs ~2.5 µs, and every
    call asks it of every input and output (a tiny decode call spent ~30 µs of its ~145 µs there)."""
    try:
        return _DTYPE_TEXT[dtype]
    except KeyError:
        text = str(dtype)
        if len(_DTYPE_TEXT) < 256:   # a handful in practice; never an unbounded cache
            _DTYPE_TEXT[dtype] = text
        return text
    except TypeError:   # an unhashable dtype-like object
        return str(dtype)


def widen_mask(t: Any) -> Any:
    """A bool or uint8 array (a mask such as mlstm's resets: nonzero = set) as int32, which the
    kernels take; any other array unchanged. NumPy, CuPy, JAX and PyTorch alike."""
    if t is None or dtype_text(getattr(t, "dtype", "")) not in _MASK_DTYPES:
        return t
    if dtype_text(t.dtype).startswith("torch."):
        import torch
        return t.to(torch.int32)
    return t.astype("int32")


def dtype_name(dtype: Any) -> str:
    """Tessera's name ("f32", "bf16", ...) for a NumPy / PyTorch / JAX dtype; TypeError otherwise."""
    name = dtype_text(dtype)
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise TypeError(f"dtype {name} is not one Tessera takes (float32, bfloat16, float16, int32, int64, "
                        "float8_e4m3fn)") from None


@dataclass(frozen=True)
class Option:
    name: str
    kind: str  # "flag", "int", "float", "str"
    help: str
    default: Any
    choices: Tuple[str, ...]

    def to_text(self, value: Any) -> str:
        """The option's value as the C++ OptionValues text."""
        # NumPy's scalars (np.float32, np.int64, np.bool_) too: values read from arrays or configs.
        if self.kind == "flag":
            if not (isinstance(value, numbers.Integral) or _is_numpy_bool(value)):
                raise TypeError(f"{self.name} must be a bool, got {type(value).__name__}")
            return "true" if value else "false"
        if self.kind == "int":
            if _is_bool(value) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{self.name} must be an int, got {type(value).__name__}")
            return str(int(value))
        if self.kind == "float":
            if value is None:
                value = 0.0
            if _is_bool(value) or not isinstance(value, numbers.Real):
                raise TypeError(f"{self.name} must be a float, got {type(value).__name__}")
            return repr(float(value))
        if not isinstance(value, str):
            raise TypeError(f"{self.name} must be a str, got {type(value).__name__}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
        return value


def _is_numpy_bool(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")  # NumPy 1, 2


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or _is_numpy_bool(value)


def _typed_default(kind: str, text: str) -> Any:
    if kind == "flag":
        return text == "true"
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


@dataclass(frozen=True)
class Input:
    name: str
    help: str
    required: bool
    differentiable: bool
    host_only: bool = False  # read on the host whatever the device (group sizes, page tables)
    autocast: bool = False  # the computation's dtype: cast to torch.autocast's (x and w; q, k, v)
    transposed: bool = False  # a 2-D transposed view is read in place (LCE's w); others are made contiguous
    seed_of: str = ""  # the option that needs this random key (dropout_p); the torch front end draws one


@dataclass
class Kernel:
    name: str
    description: str
    passes: Tuple[str, ...]
    inputs: Tuple[Input, ...]
    grad_inputs: Tuple[Input, ...]
    options: Tuple[Option, ...]
    forward_outputs: Tuple[str, ...]
    saved_outputs: Tuple[str, ...]
    implementations: List[Dict[str, Any]] = field(default_factory=list)
    # Gradient outputs a backward / fused call may leave out (``skip=``): their work is skipped.
    skippable: Tuple[str, ...] = ()

    @property
    def saved_only(self) -> Tuple[str, ...]:
        """Saved outputs that are not also returned (lse); a forward output may be both (attention's o)."""
        return tuple(n for n in self.saved_outputs if n not in self.forward_outputs)

    @property
    def forward_order(self) -> Tuple[str, ...]:
        """The leading outputs of a forward pass, in order: forward_outputs, then saved_only."""
        return self.forward_outputs + self.saved_only

    def takes_grad(self, output: str) -> bool:
        """Whether an upstream gradient of `output` reaches the backward: the forward_outputs (it
        is required), and any other output whose ``grad_<output>`` the backward declares
        (optional: mlstm's and slstm's last states, so that chained calls keep their gradient)."""
        return output in self.forward_outputs or any(g.name == "grad_" + output for g in self.grad_inputs)

    @property
    def forward_only(self) -> bool:
        """No backward pass (paged_attention, mla_decode): differentiating through it is an error."""
        return "backward" not in self.passes

    def no_gradient(self, detach: str) -> str:
        """The error of a gradient asked of a forward-only kernel; `detach` says how not to ask."""
        return (f"{self.name}: forward only (no backward pass): no gradient reaches its inputs; "
                f"{detach} to use its outputs in a differentiated computation")

    def no_second_order(self) -> str:
        """The error of a second derivative: the backward pass is not itself differentiated."""
        return (f"{self.name}: no second derivative: its backward pass is not differentiable "
                "(a gradient of its gradients, e.g. create_graph=True / a gradient penalty, is not supported)")

    @property
    def saved_flags(self) -> Tuple[str, ...]:
        """``return_<name>`` for each saved-only output (``return_lse``): asks for it after the others."""
        return tuple("return_" + n for n in self.saved_only)

    def wanted_saved(self, extras: Dict[str, Any]) -> Tuple[str, ...]:
        """The saved-only outputs that ``return_<name>=True`` asked for, in order."""
        return tuple(n for n in self.saved_only if extras.get("return_" + n))

    def signature(self, extra: Sequence[inspect.Parameter] = ()) -> inspect.Signature:
        """Required inputs positional; optional inputs, options and return_<saved> keyword-only.
        Built once per `extra` (every call binds its arguments to it: building it took a fifth of
        a small call's time in Python)."""
        cache = self.__dict__.setdefault("_signatures", {})
        key = tuple(extra)
        if key not in cache:
            cache[key] = self._make_signature(key)
        return cache[key]

    def _make_signature(self, extra: Tuple[inspect.Parameter, ...]) -> inspect.Signature:
        P = inspect.Parameter
        params = [P(i.name, P.POSITIONAL_OR_KEYWORD) for i in self.inputs if i.required]
        params += [P(i.name, P.KEYWORD_ONLY, default=None) for i in self.inputs if not i.required]
        params += [P(o.name, P.KEYWORD_ONLY, default=o.default) for o in self.options]
        params += [P(f, P.KEYWORD_ONLY, default=False) for f in self.saved_flags]
        params += [P("implementation", P.KEYWORD_ONLY, default=None)]
        params += [P("memory_budget", P.KEYWORD_ONLY, default=None)]
        params += list(extra)
        return inspect.Signature(params)

    def _binding(self, extra: Tuple[inspect.Parameter, ...]):
        """(positional names, defaults of every parameter that has one, every name) of the
        signature, built once per `extra`."""
        cache = self.__dict__.setdefault("_bindings", {})
        if extra not in cache:
            params = self.signature(extra).parameters.values()
            positional = tuple(p.name for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)
            defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
            cache[extra] = (positional, defaults, frozenset(p.name for p in params))
        return cache[extra]

    def _bound(self, args: Sequence[Any], kwargs: Dict[str, Any], extra: Tuple[inspect.Parameter, ...]):
        """Every parameter's value, as Signature.bind + apply_defaults give them (the same errors,
        TypeError), without inspect's per-call cost (~35 µs: a third of a small NumPy call)."""
        positional, defaults, names = self._binding(extra)
        if len(args) > len(positional):
            raise TypeError(f"{self.name}() takes {len(positional)} positional arguments but {len(args)} were given")
        a = dict(defaults)
        a.update(zip(positional, args))
        for n, v in kwargs.items():
            if n not in names:
                raise TypeError(f"{self.name}() got an unexpected keyword argument '{n}'")
            if n in positional[:len(args)]:
                raise TypeError(f"{self.name}() got multiple values for argument '{n}'")
            a[n] = v
        for n in names:
            if n not in a:
                raise TypeError(f"{self.name}() missing a required argument: '{n}'")
        return a

    def bind(self, args: Sequence[Any], kwargs: Dict[str, Any], extra: Sequence[inspect.Parameter] = ()):
        """(tensors by name (None when absent), options as typed values, implementation, extras);
        extras["memory_budget"] is the checked budget in bytes (0: the backend's default)."""
        a = self._bound(args, canonical_keywords(self.name, kwargs), tuple(extra))
        tensors = {i.name: a[i.name] for i in self.inputs}
        for i in self.inputs:
            if i.required and tensors[i.name] is None:
                raise ValueError(f"{self.name}: {i.name} is required")
        options = {o.name: a[o.name] for o in self.options}
        extras = {p.name: a[p.name] for p in extra}
        extras.update({f: bool(a[f]) for f in self.saved_flags})
        extras["memory_budget"] = memory_budget_bytes(a["memory_budget"], self.name)
        return tensors, options, a["implementation"] or "", extras

    def option_texts(self, options: Dict[str, Any]) -> Dict[str, str]:
        by_name = {o.name: o for o in self.options}
        return {k: by_name[k].to_text(v) for k, v in options.items()}

    def returns_doc(self) -> str:
        """What the generated function returns, from the signature (forward and saved outputs)."""
        hidden = f" (the saved {', '.join(self.saved_only)} stays internal)" if self.saved_only else ""
        extra = [o.name for o in self.options if o.kind == "flag" and o.name.startswith("return_")]
        more = f"; {', '.join(extra)} add their outputs after it, as a tuple" if extra else ""
        saved = "".join(f"; return_{n}=True appends {n}" for n in self.saved_only)
        if not self.forward_outputs:  # a forward-only kernel that declares none (mla_decode): all of them
            return (f"\n\nReturns every output of the forward, as a tuple in the order of "
                    f"docs/kernels/{self.name}.md{more}; no gradient flows through them.")
        return f"\n\nReturns {', '.join(self.forward_outputs)}{hidden}{more}{saved}."

    def doc(self, front_end: str) -> str:
        lines = [f"{self.description}.", "", f"Tessera kernel `{self.name}` ({front_end}).", "", "Inputs:"]
        for i in self.inputs:
            lines.append(f"  {i.name}{'' if i.required else ' (optional)'}: {i.help}")
        lines += ["", "Options (keyword-only):"]
        for o in self.options:
            choices = f" [{', '.join(o.choices)}]" if o.choices else ""
            lines.append(f"  {o.name}={o.default!r}{choices}: {o.help}")
        for n in self.saved_only:
            lines.append(f"  return_{n}=False: also return the forward's {n} (last; no gradient flows through it)")
        lines.append("  implementation=None: an implementation name or a comma list "
                     "(default: the dispatch order; TESSERA_IMPLEMENTATION overrides it)")
        lines.append("  memory_budget=None: bytes of extra memory (scratch) the implementation may use "
                     "(None or 0: its default; what each backend does under it is in the kernel's docs)")
        return "\n".join(lines)


# Python keywords renamed after they shipped (one vocabulary across kernels, issue #23): the older
# spelling keeps working. The CLI's older spellings are declared with the option in C++ (aliases).
OLDER_KEYWORDS: Dict[str, Dict[str, str]] = {"linear_cross_entropy": {"soft_cap": "softcap"}}


def canonical_keywords(kernel: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """kwargs with the older spellings of `kernel`'s keywords renamed (soft_cap -> softcap); both
    spellings at once is a TypeError."""
    older = OLDER_KEYWORDS.get(kernel, {})
    if not any(k in older for k in kwargs):
        return kwargs
    out = dict(kwargs)
    for old, new in older.items():
        if old in out:
            if new in out:
                raise TypeError(f"{kernel}: {old} is the older spelling of {new}; give one of them")
            out[new] = out.pop(old)
    return out


def older_keyword(kernel: str, name: str, value: Any, older_value: Any, default: Any) -> Any:
    """An explicit keyword `name` and its older spelling given as `older_value` (None: not given)."""
    if older_value is None:
        return value
    old = next(o for o, n in OLDER_KEYWORDS[kernel].items() if n == name)
    if value != default:
        raise TypeError(f"{kernel}: {old} is the older spelling of {name}; give one of them")
    return older_value


def memory_budget_bytes(value: Any, kernel: str = "") -> int:
    """ExecOptions::memory_budget from a Python value: None or 0 is the backend's default, else a
    whole number of bytes (an int, a NumPy integer; not a bool or a float)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{kernel or 'tessera'}: memory_budget takes a whole number of bytes or None, "
                        f"got {type(value).__name__}")
    if value < 0 or value >= 2 ** 63:
        raise ValueError(f"{kernel or 'tessera'}: memory_budget must be in [0, 2**63) bytes, got {value}")
    return int(value)


def _load() -> Dict[str, Kernel]:
    out = {}
    for d in _ext.kernels():
        opts = tuple(Option(o["name"], o["kind"], o["help"], _typed_default(o["kind"], o["default"]),
                            tuple(o["choices"])) for o in d["options"])
        ins = tuple(Input(i["name"], i["help"], i["required"], i["differentiable"], i["host_only"], i["autocast"],
                          i["transposed"], i["seed_of"])
                    for i in d["inputs"])
        gins = tuple(Input(i["name"], i["help"], i["required"], i["differentiable"], i["host_only"], i["autocast"],
                           i["transposed"], i["seed_of"])
                     for i in d["grad_inputs"])
        out[d["name"]] = Kernel(d["name"], d["description"], tuple(d["passes"]), ins, gins, opts,
                                tuple(d["forward_outputs"]), tuple(d["saved_outputs"]), d["implementations"],
                                tuple(d["skippable"]))
    return out


KERNELS: Dict[str, Kernel] = _load()


def meta(shape: Sequence[int], dtype: Any, strides: Optional[Sequence[int]] = None):
    return (dtype_name(dtype), [int(s) for s in shape], [int(s) for s in strides] if strides is not None else [])


def outputs(kernel: Kernel, pass_: str, metas: Dict[str, Any], options: Dict[str, str], skip: Sequence[str] = ()):
    """[(name, dtype name, shape, strides)] that `pass_` writes for inputs of these metas (the
    gradients in `skip` left out)."""
    return _ext.outputs(kernel.name, pass_, metas, options, list(skip))


def public_outputs(kernel: Kernel, names: Sequence[str]) -> List[str]:
    """The forward outputs a user gets back: all but the saved ones (lse stays internal)."""
    return [n for n in names if n not in kernel.saved_only]
