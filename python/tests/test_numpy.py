"""tessera.<kernel> on NumPy arrays: values, zero-copy, errors, the GIL."""
import inspect
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tessera
from tessera import _ext

import reference as ref

OPTIONS = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"label_smoothing": 0.1},
    {"z_loss_weight": 1e-3},
    {"softcap": 5.0},
    {"reduction": "sum", "label_smoothing": 0.2, "z_loss_weight": 1e-2, "softcap": 3.0},
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_values(opts, impl):
    x, w, y = ref.problem()
    got = tessera.linear_cross_entropy(x, w, y, implementation=impl, **opts)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref.loss(x, w, y, **opts), rtol=2e-5, atol=2e-5)


def test_bias_token_weights_hv_layout_and_leading_axes():
    x, w, y = ref.problem(B=24)
    rng = np.random.default_rng(1)
    b = rng.standard_normal(w.shape[0]).astype(np.float32)
    tw = rng.random(24).astype(np.float32)
    want = ref.loss(x, w, y, bias=b, token_weights=tw)
    got = tessera.linear_cross_entropy(x.reshape(4, 6, -1), np.ascontiguousarray(w.T), y.reshape(4, 6),
                                       bias=b, token_weights=tw.reshape(4, 6))
    np.testing.assert_allclose(got, want, rtol=2e-5)
    # A transposed view of w is taken as it is (no copy), like the C++ API.
    np.testing.assert_allclose(tessera.linear_cross_entropy(x, np.ascontiguousarray(w.T).T, y, bias=b,
                                                            token_weights=tw), want, rtol=2e-5)


def test_argmax_and_int32_labels():
    x, w, y = ref.problem(ignore=False)
    loss, am = tessera.linear_cross_entropy(x, w, y.astype(np.int32), reduction="none", return_argmax=True)
    assert loss.shape == (24,) and am.dtype == np.int64
    np.testing.assert_array_equal(am, (x.astype(np.float64) @ w.T.astype(np.float64)).argmax(-1))


def test_backward_matches_analytic_gradient():
    x, w, y = ref.problem()
    out = tessera.call("linear_cross_entropy", "backward",
                       {"x": x, "w": w, "labels": y, "grad_loss": np.array(2.0, np.float32)})
    z = x.astype(np.float64) @ w.T.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    keep = y != -100
    p[np.arange(24), np.where(keep, y, 0)] -= 1
    dz = 2.0 * p * keep[:, None] / keep.sum()
    np.testing.assert_allclose(out["dx"], dz @ w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out["dw"], dz.T @ x, rtol=1e-4, atol=1e-6)
    fused = tessera.call("linear_cross_entropy", "fused",
                         {"x": x, "w": w, "labels": y, "grad_loss": np.array(2.0, np.float32)})
    np.testing.assert_allclose(fused["loss"], ref.loss(x, w, y), rtol=2e-5)
    np.testing.assert_allclose(fused["dw"], out["dw"], rtol=1e-5, atol=1e-7)


def test_zero_copy_inputs():
    big = np.zeros((40, 32), np.float32)
    x, w, y = ref.problem()
    big[8:32] = x
    view = big[8:32]  # contiguous, at an offset inside another array
    seen = _ext.view(view)
    assert seen["data"] == view.ctypes.data and seen["strides"] == [32, 1]
    np.testing.assert_allclose(tessera.linear_cross_entropy(view, w, y), ref.loss(x, w, y), rtol=2e-5)
    # The kernel reads the caller's memory: changing it changes the result, nothing is cached.
    big[8:32] *= 2
    np.testing.assert_allclose(tessera.linear_cross_entropy(view, w, y), ref.loss(2 * x, w, y), rtol=2e-5)


def test_outputs_are_written_in_place():
    x, w, y = ref.problem()
    loss = np.full((), -1.0, np.float32)
    lse = np.full(24, -1.0, np.float32)
    ptr = loss.ctypes.data
    _ext.call("linear_cross_entropy", "forward", {"x": x, "w": w, "labels": y}, [loss, lse], {})
    assert loss.ctypes.data == ptr
    np.testing.assert_allclose(loss, ref.loss(x, w, y), rtol=2e-5)


def test_errors_are_exceptions_with_the_cpp_message():
    x, w, y = ref.problem()
    f = tessera.linear_cross_entropy
    with pytest.raises(TypeError, match="w dtype f16 differs from x dtype f32"):
        f(x, w.astype(np.float16), y)
    with pytest.raises(TypeError, match="labels must be i32 or i64, got f32"):
        f(x, w, y.astype(np.float32))
    with pytest.raises(TypeError, match="x has dtype float64"):
        f(x.astype(np.float64), w, y)
    with pytest.raises(ValueError, match=r"label 80 at token 0 is outside \[0, V=80\)"):
        f(x, w, np.full(24, 80))
    with pytest.raises(ValueError, match="labels shape \\[23\\] does not match"):
        f(x, w, y[:23])
    with pytest.raises(ValueError, match="w is square"):
        f(x, np.zeros((32, 32), np.float32), y)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        f(x, w, y, label_smoothing=2.0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        f(x, w, y, reduction="avg")
    with pytest.raises(ValueError, match="unknown implementation 'nope'"):
        f(x, w, y, implementation="nope")
    with pytest.raises(TypeError):
        f(x, w, y, no_such_option=1)
    with pytest.raises(TypeError, match="z_loss_weight must be a float"):
        f(x, w, y, z_loss_weight="big")


def test_options_take_numpy_scalars():
    """np.float32 / np.int64 / np.bool_ option values (read from arrays or configs) mean what the
    Python numbers mean; a float for an int option and a bool for a number are still refused."""
    x, w, y = ref.problem(seed=3)
    f = tessera.linear_cross_entropy
    want = f(x, w, y, z_loss_weight=1e-4, ignore_index=-100, return_argmax=True)
    got = f(x, w, y, z_loss_weight=np.float32(1e-4), ignore_index=np.int64(-100), return_argmax=np.bool_(True))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="ignore_index must be an int, got float32"):
        f(x, w, y, ignore_index=np.float32(1))
    with pytest.raises(TypeError, match="z_loss_weight must be a float, got bool"):
        f(x, w, y, z_loss_weight=np.bool_(True))


def test_signature_generated_from_the_registry():
    sig = inspect.signature(tessera.linear_cross_entropy)
    assert list(sig.parameters)[:3] == ["x", "w", "labels"]
    assert sig.parameters["bias"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["reduction"].default == "mean"
    assert sig.parameters["ignore_index"].default == -100
    names = [k["name"] for k in tessera.kernels()]
    assert "linear_cross_entropy" in names
    for n in names:
        assert callable(getattr(tessera, n))
    assert any(i["name"] == "reference" for i in tessera.implementations("linear_cross_entropy"))


def test_soft_cap_is_the_older_spelling_of_softcap():
    """The soft cap is `softcap` in every kernel (attention's name, Liger's, CCE's); linear_cross_entropy
    called it soft_cap until 2026-11-29, and that keyword keeps working (functions and tessera.call)."""
    x, w, y = ref.problem()
    want = tessera.linear_cross_entropy(x, w, y, softcap=3.0)
    assert want != tessera.linear_cross_entropy(x, w, y)  # the cap changes the loss: it was read
    assert tessera.linear_cross_entropy(x, w, y, soft_cap=3.0) == want
    assert tessera.call("linear_cross_entropy", "forward", {"x": x, "w": w, "labels": y}, soft_cap=3.0)["loss"] == want
    assert "softcap" in inspect.signature(tessera.linear_cross_entropy).parameters
    with pytest.raises(TypeError, match="soft_cap is the older spelling of softcap"):
        tessera.linear_cross_entropy(x, w, y, softcap=3.0, soft_cap=3.0)
    # The vocab-parallel functions take it as an explicit keyword: resolved by older_keyword.
    from tessera._registry import older_keyword
    assert older_keyword("linear_cross_entropy", "softcap", 0.0, 3.0, 0.0) == 3.0
    assert older_keyword("linear_cross_entropy", "softcap", 3.0, None, 0.0) == 3.0
    with pytest.raises(TypeError, match="older spelling"):
        older_keyword("linear_cross_entropy", "softcap", 2.0, 3.0, 0.0)


def test_gil_is_released_while_a_kernel_runs():
    x, w, y = ref.problem(B=256, H=128, V=4096, ignore=False)
    started, done = threading.Event(), threading.Event()
    ticks = 0

    def work():
        started.set()
        tessera.linear_cross_entropy(x, w, y, implementation="reference")
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    while not done.is_set():
        ticks += 1
    t.join()
    # With the GIL held for the whole call, this thread could not have run meanwhile.
    assert ticks > 1000


def test_metric_outputs_follow_the_loss():
    """return_argmax, return_z_loss, return_token_accuracy: (loss, argmax, z_loss, accuracy), in that order."""
    x, w, y = ref.problem()
    lam = 1e-2
    loss, am, z_loss, acc = tessera.linear_cross_entropy(x, w, y, z_loss_weight=lam, return_argmax=True,
                                                         return_z_loss=True, return_token_accuracy=True)
    z = x.astype(np.float64) @ w.T.astype(np.float64)
    m = z.max(-1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(-1))
    kept = y != -100
    np.testing.assert_allclose(z_loss, lam * (lse[kept] ** 2).mean(), rtol=1e-5)
    np.testing.assert_array_equal(am, z.argmax(-1))
    assert acc == pytest.approx((z.argmax(-1)[kept] == y[kept]).mean())
    np.testing.assert_allclose(loss, ref.loss(x, w, y, z_loss_weight=lam), rtol=2e-5)


def test_skip_ignored_is_a_keyword_on_by_default():
    # Ignored tokens are skipped before any GEMM (their lse is 0); skip_ignored=False computes
    # every row, so the ignored tokens' lse is their logsumexp. The loss is the same either way.
    x, w, y = ref.problem(B=16)
    y = y.copy()
    y[::3] = -100
    args = {"x": x, "w": w, "labels": y}
    skip = tessera.call("linear_cross_entropy", "forward", args, reduction="none")
    every = tessera.call("linear_cross_entropy", "forward", args, reduction="none", skip_ignored=False)
    z = x.astype(np.float64) @ w.astype(np.float64).T
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    np.testing.assert_array_equal(skip["lse"][::3], 0.0)
    np.testing.assert_allclose(every["lse"], lse, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(every["loss"], skip["loss"], rtol=1e-6, atol=1e-6)
    opt = {o.name: o for o in tessera.KERNELS["linear_cross_entropy"].options}["skip_ignored"]
    assert opt.kind == "flag" and opt.default is True


def test_host_work_loads_no_cuda_runtime():
    """A process that imports tessera and runs a kernel on NumPy arrays maps no CUDA runtime, and
    the extension needs none (DESIGN: a device runtime loads with the device module, on first
    use). Its JAX handler for CUDA is there all the same, working through that module."""
    code = ("import numpy as np, tessera\n"
            "x = np.ones((4, 8), np.float32); w = np.ones((16, 8), np.float32); y = np.zeros(4, np.int64)\n"
            "tessera.linear_cross_entropy(x, w, y)\n"
            "print(sorted(tessera._ext.ffi_targets()))\n"
            "print(open('/proc/self/maps').read())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    first, maps = done.stdout.split("\n", 1)
    assert first == "['cpu', 'cuda']"
    for lib in ("libcudart", "libcublas", "libtessera_cuda"):
        assert lib not in maps, f"{lib} is mapped after host work"



@pytest.mark.parametrize("impl", ["cpu", "cpu_v2"])
def test_non_finite_hidden_state_makes_its_token_loss_nan(impl):
    # A NaN or Inf in one token's hidden state (check_finite is off by default) must make that
    # token's loss NaN, as the reference's, and leave the others: a fused softmax that dropped it
    # would hide a diverged step behind a finite loss (attention's cpu softmax did, 2026-11-28).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32), dtype=np.float32)
    w = (rng.standard_normal((300, 32)) * 0.1).astype(np.float32)
    y = rng.integers(0, 300, 16).astype(np.int64)
    for bad in (np.nan, np.inf, -np.inf):
        xx = x.copy()
        xx[3, 5] = bad
        want = np.asarray(tessera.linear_cross_entropy(xx, w, y, implementation="reference", reduction="none"))
        got = np.asarray(tessera.linear_cross_entropy(xx, w, y, implementation=impl, reduction="none"))
        assert np.isnan(want[3]) and np.isnan(got[3]), (bad, got[3])
        keep = np.arange(16) != 3
        np.testing.assert_allclose(got[keep], want[keep], rtol=1e-5)
        assert np.isnan(tessera.linear_cross_entropy(xx, w, y, implementation=impl)), bad


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_bf16_numpy_arrays(impl):
    """NumPy bf16 (ml_dtypes.bfloat16) in and out: DLPack cannot describe the dtype, so it crosses
    as a uint16 view flagged bf16 (before, every bf16 call failed in nanobind with
    "incompatible function arguments"). Values against the f32 call on the same rounded inputs."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    x, w, y = ref.problem(B=24, H=32, V=80, seed=5)
    xb, wb = x.astype(bf16), w.astype(bf16)
    g = np.float32(1.0)
    got = tessera.call("linear_cross_entropy", "fused", {"x": xb, "w": wb, "labels": y, "grad_loss": g},
                       implementation=impl)
    want = tessera.call("linear_cross_entropy", "fused", {"x": xb.astype(np.float32), "w": wb.astype(np.float32),
                                                           "labels": y, "grad_loss": g}, implementation="reference")
    assert got["dx"].dtype == bf16 and got["dw"].dtype == bf16 and got["loss"].dtype == np.float32
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    for n in ("dx", "dw"):  # one bf16 rounding of the f32 gradient (2^-8 relative) plus f32 sums
        scale = np.abs(want[n]).max()
        np.testing.assert_allclose(got[n].astype(np.float32), want[n], rtol=2**-7, atol=2**-8 * scale, err_msg=n)
    # The generated function on a view of the arrays; attention's bf16 output too.
    loss = tessera.linear_cross_entropy(xb[:12], wb, y[:12], implementation=impl)
    np.testing.assert_allclose(loss, tessera.linear_cross_entropy(xb[:12].astype(np.float32), wb.astype(np.float32),
                                                                  y[:12], implementation="reference"), rtol=1e-4)
    rng = np.random.default_rng(6)
    q, k, v = (rng.uniform(-1, 1, (1, 5, 2, 8)).astype(bf16) for _ in range(3))
    o = tessera.attention(q, k, v, causal=True, implementation=impl)
    o32 = tessera.attention(*(a.astype(np.float32) for a in (q, k, v)), causal=True, implementation="reference")
    assert o.dtype == bf16
    np.testing.assert_allclose(o.astype(np.float32), o32, rtol=2**-6, atol=2**-7)
    # Only a flagged uint16 is bf16: a plain uint16 array is still refused.
    assert _ext.view(xb.view(np.uint16), "x", ml_bits=True)["dtype"] == "bf16"
    with pytest.raises(TypeError, match="x has dtype uint16 which Tessera does not take"):
        tessera.call("linear_cross_entropy", "forward", {"x": xb.view(np.uint16), "w": wb, "labels": y})


def test_lists_are_arrays_and_other_byte_orders_are_named():
    """A Python list is taken as np.asarray of it; a big-endian array is refused by name (both gave
    nanobind's raw 'incompatible function arguments' listing; a reviewer's finding)."""
    x, w, y = ref.problem(B=6, H=8, V=10)
    want = tessera.linear_cross_entropy(x, w, y)
    np.testing.assert_array_equal(tessera.linear_cross_entropy(x, w, [int(t) for t in y]), want)
    np.testing.assert_array_equal(tessera.linear_cross_entropy(x.tolist(), w, y), want)  # Python floats: f32
    with pytest.raises(TypeError, match=r"x is a >f4 array in the other byte order: pass x\.astype"):
        tessera.linear_cross_entropy(x.astype(">f4"), w, y)
    with pytest.raises(TypeError, match=r"labels \(object\) is not an array"):
        tessera.linear_cross_entropy(x, w, object())


def test_strided_views_are_copied_once_and_a_transposed_w_is_read_in_place():
    x, w, y = ref.problem()
    wide = np.repeat(x, 2, axis=1)                  # x[:, j] = wide[:, 2j]
    assert not wide[:, ::2].flags.c_contiguous
    want = tessera.linear_cross_entropy(x, w, y)
    assert tessera.linear_cross_entropy(wide[:, ::2], w, y) == want
    w_hv = np.ascontiguousarray(w.T)                # [H, V] in memory, w_hv.T a transposed view
    assert tessera.linear_cross_entropy(x, w_hv.T, y) == pytest.approx(want, rel=1e-6)
    g = tessera.call("linear_cross_entropy", "fused", {"x": x, "w": w_hv.T, "labels": y,
                                                        "grad_loss": np.ones((), np.float32)})
    assert g["dw"].flags.f_contiguous and not g["dw"].flags.c_contiguous  # dw in w's layout: w not copied
    strided_w = np.repeat(w, 2, axis=0)[::2]        # neither layout: copied
    assert tessera.linear_cross_entropy(x, strided_w, y) == want
