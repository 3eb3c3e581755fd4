"""CUDA tensors through tessera.torch: for every kernel, CUDA tensors give the values and the
gradients that the same tensors give on the CPU (the cpu or reference implementation), the
result stays on the device, and the op runs on the caller's stream. Needs a GPU that PyTorch sees
(scripts/gpu_check.sh runs this file in its test stage, with TESSERA_REQUIRE_CUDA=1: there a missing
GPU or an unavailable cuda implementation fails instead of skipping); skipped elsewhere.

Tolerance: both sides accumulate in f32 in different orders (~1e-6 relative on these small
shapes); 2e-3 relative also covers a cuBLAS that uses TF32 for f32 products (2^-11 per product).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

import reference as ref  # noqa: E402
import test_attention as t_att  # noqa: E402
import test_grouped_matmul as t_gmm  # noqa: E402
import test_mla_decode as t_mla  # noqa: E402
import test_mlstm as t_mlstm  # noqa: E402
import test_paged_attention as t_paged  # noqa: E402
import test_slstm as t_slstm  # noqa: E402

REQUIRED = os.environ.get("TESSERA_REQUIRE_CUDA") == "1"
if REQUIRED and not torch.cuda.is_available():
    raise RuntimeError("TESSERA_REQUIRE_CUDA=1 but PyTorch sees no CUDA device")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")

RTOL, ATOL = 2e-3, 2e-4


def lce():
    x, w, y = ref.problem(seed=5)
    return "linear_cross_entropy", {"x": x, "w": w, "labels": y}, {}, ["x", "w"]


def attention():
    q, k, v = t_att.qkv(Hq=4, Hkv=2, D=8, Dv=8, seed=5)
    return "attention", {"q": q, "k": k, "v": v}, {"causal": True}, ["q", "k", "v"]


def attention_dropout():
    q, k, v = t_att.qkv(Hq=4, Hkv=2, D=8, Dv=8, seed=6)
    arrays = {"q": q, "k": k, "v": v, "dropout_seed": np.array([12345, -678], np.int32)}  # on the device too
    return "attention", arrays, {"causal": True, "dropout_p": 0.3}, ["q", "k", "v"]


def attention_bias():
    q, k, v = t_att.qkv(Hq=4, Hkv=2, D=8, Dv=8, seed=7)
    bias = np.random.default_rng(8).standard_normal((1, 4, 7, 9)).astype(np.float32)
    bias[0, 1, :, 3] = -np.inf  # a masked key of one head
    return "attention", {"q": q, "k": k, "v": v, "bias": bias}, {"causal": True, "softcap": 3.0}, ["q", "k", "v", "bias"]


def grouped_matmul():
    lhs, rhs, sizes = t_gmm.problem(seed=5)
    return "grouped_matmul", {"lhs": lhs, "rhs": rhs, "group_sizes": sizes}, {}, ["lhs", "rhs"]


def mlstm():
    x = t_mlstm.problem(seed=5, state=True)
    return "mlstm", x, {}, ["q", "k", "v", "i", "f", "c0", "n0"]


def slstm():
    d = t_slstm.problem(seed=5, initial=True, resets=True)
    return "slstm", d, {}, ["wx", "r", "b", "h0", "c0", "n0"]


def paged_attention():
    q, k, v, pt, kv, cu = t_paged.problem(seed=5)
    names = ("q", "k_cache", "v_cache", "page_table", "kv_lens", "cu_q_lens")
    return "paged_attention", dict(zip(names, (q, k, v, pt, kv, cu))), {"causal": True}, []


def paged_attention_f8():
    q, k8, v8, pt, kv, cu, _, _ = t_paged.f8_problem(seed=6)
    names = ("q", "k_cache", "v_cache", "page_table", "kv_lens", "cu_q_lens")
    return ("paged_attention", dict(zip(names, (q, k8, v8, pt, kv, cu))),
            {"causal": True, "k_scale": 0.02, "v_scale": 0.05}, [])


def mla_decode():
    q, kv, pt, lens = t_mla.problem(seed=5)
    return "mla_decode", {"q": q, "kv_cache": kv, "page_table": pt, "cache_seqlens": lens}, {"dv": 16, "causal": True}, []


def mla_decode_f8():
    q, kv8, pt, lens, _ = t_mla.f8_problem(seed=6)
    return ("mla_decode", {"q": q, "kv_cache": kv8, "page_table": pt, "cache_seqlens": lens},
            {"dv": 16, "causal": True, "kv_scale": 0.03}, [])


CASES = [lce, attention, attention_dropout, attention_bias, grouped_matmul, mlstm, slstm, paged_attention,
         paged_attention_f8, mla_decode, mla_decode_f8]


def require_cuda_implementation(kernel):
    """Skips a kernel this build has no cuda implementation of; with a GPU present, one that is
    there but unavailable (a module not found, a driver refused) is a failure, not a skip."""
    impls = [i for i in tessera.implementations(kernel) if i["device"] == "cuda"]
    if not impls:
        pytest.skip(f"{kernel}: no cuda implementation in this build")
    if not any(i["available"] for i in impls):
        pytest.fail(f"{kernel}: PyTorch sees a GPU but " + "; ".join(f"{i['name']}: {i['unavailable_reason']}" for i in impls))


def _torch_of(a):
    """A NumPy array as a tensor; ml_dtypes' float8_e4m3fn (which torch.from_numpy cannot read) by its bits."""
    if str(a.dtype) == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def run(kernel, arrays, options, diff, device):
    """The op's outputs and the gradients of `diff` (upstream: a fixed ramp per output)."""
    t = {n: _torch_of(np.ascontiguousarray(a)).to(device) for n, a in arrays.items()}
    for n in diff:
        t[n].requires_grad_()
    outs = getattr(tt, kernel)(**t, **options)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    grads = []
    if diff:
        total = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=device).reshape(o.shape)).sum()
                    for o in outs if o.is_floating_point() and o.requires_grad)
        grads = torch.autograd.grad(total, [t[n] for n in diff])
    return outs, grads


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_cuda_tensors_match_cpu_tensors(case):
    kernel, arrays, options, diff = case()
    require_cuda_implementation(kernel)
    want, want_grads = run(kernel, arrays, options, diff, "cpu")
    got, got_grads = run(kernel, arrays, options, diff, "cuda")
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "cuda", f"output {i} left the device"
        torch.testing.assert_close(g.detach().cpu(), w.detach(), rtol=RTOL, atol=ATOL, msg=f"{kernel} output {i}")
    for n, g, w in zip(diff, got_grads, want_grads):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), w, rtol=RTOL, atol=ATOL, msg=f"{kernel} d{n}")


def test_dropout_seed_drawn_on_the_device():
    """Without a dropout_seed, tessera.torch draws one from the CUDA generator (a device tensor the
    kernel reads there): torch.manual_seed reproduces the mask, the next call draws another."""
    require_cuda_implementation("attention")
    q, k, v = (torch.from_numpy(a).cuda() for a in t_att.qkv(seed=7))
    torch.manual_seed(3)
    a = tt.attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(3)
    b = tt.attention(q, k, v, dropout_p=0.2)
    c = tt.attention(q, k, v, dropout_p=0.2)
    assert a.device.type == "cuda" and torch.equal(a, b) and not torch.equal(a, c)


def test_the_op_runs_on_the_callers_stream():
    """On a side stream that first sleeps ~50 ms and only then produces x, the op must run after
    the producer (on that stream) and its result be read back on that stream: an op launched on
    the legacy stream would read x before it exists."""
    kernel, arrays, options, _ = lce()
    require_cuda_implementation(kernel)
    want, _ = run(kernel, arrays, options, [], "cpu")
    half = {n: torch.from_numpy(a).to("cuda") for n, a in arrays.items()}
    half["x"] = half["x"] * 0.5
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # ~50 ms of device clock cycles on s
        t = dict(half, x=half["x"] * 2.0)  # exact in f32: x exists only after the sleep
        loss = tt.linear_cross_entropy(**t, **options)
        got = torch.empty(loss.shape, dtype=loss.dtype, pin_memory=True)
        got.copy_(loss, non_blocking=True)
    s.synchronize()
    torch.testing.assert_close(got, want[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fused_in_forward_on_cuda_matches_forward_then_backward(dtype):
    """linear_cross_entropy with a scalar loss runs the fused op in the forward on CUDA too; its
    gradients (scaled by 3 in the backward) against the forward op + backward op's."""
    require_cuda_implementation("linear_cross_entropy")
    x, w, y = ref.problem(seed=5)
    out = []
    for fn in (tt.linear_cross_entropy, tt._single_device_linear_cross_entropy):
        xt = torch.from_numpy(x).to("cuda", dtype).requires_grad_()
        wt = torch.from_numpy(w).to("cuda", dtype).requires_grad_()
        loss = fn(xt, wt, torch.from_numpy(y).to("cuda"), reduction="sum", label_smoothing=0.1)
        (loss * 3.0).backward()
        out.append((type(loss.grad_fn).__name__, loss.detach().cpu(), xt.grad.cpu(), wt.grad.cpu()))
    (name_f, *fused), (name_p, *plain) = out
    assert "fused" in name_f and "fused" not in name_p
    # Same math, the gradient scaled after (fused) or inside (backward) the kernel: bf16 rounds
    # twice on the fused side, so a tolerance relative to the gradient's scale (see test_torch).
    for a, r in zip(fused, plain):
        scale = r.float().abs().max().item()
        tol = dict(rtol=1e-5, atol=1e-5 * scale) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2 ** -6 * scale)
        torch.testing.assert_close(a.float(), r.float(), **tol)


def test_fused_backward_scales_in_f32_on_cuda():
    """The fused op's saved bf16 gradients times an upstream g = 0.1: the f32 product rounded once
    (a bf16 tensor times a 0-d f32 CUDA tensor computed in bf16, g rounded first: up to 2^-9 off)."""
    require_cuda_implementation("linear_cross_entropy")
    x, w, y = ref.problem(seed=5)
    xt = torch.from_numpy(x).to("cuda", torch.bfloat16).requires_grad_()
    wt = torch.from_numpy(w).to("cuda", torch.bfloat16)
    yt = torch.from_numpy(y).to("cuda")
    tt.linear_cross_entropy(xt, wt, yt).backward()
    g1 = xt.grad.clone()
    xt.grad = None
    (tt.linear_cross_entropy(xt, wt, yt) * 0.1).backward()
    assert torch.equal(xt.grad, (g1.float() * 0.1).to(torch.bfloat16))


def jax_on_gpu(kernel):
    """JAX, its first GPU and tessera.jax, or a skip (no JAX, no GPU, no cuda implementation)."""
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU")
    require_cuda_implementation(kernel)
    import tessera.jax as tj
    return jax, gpu, tj


def test_jax_host_read_inputs_on_gpu():
    """tessera.jax on GPU arrays: group sizes (read on the host) arrive in device memory and are
    copied to the host by the FFI handler; the result matches NumPy's."""
    jax, gpu, tj = jax_on_gpu("grouped_matmul")
    lhs, rhs, sizes = t_gmm.problem(seed=5)
    want = tessera.grouped_matmul(lhs, rhs, sizes)
    got = tj.grouped_matmul(*(jax.device_put(a, gpu) for a in (lhs, rhs, sizes)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL)


def test_jax_empty_host_read_inputs_on_gpu():
    """XLA hands an empty buffer as a null pointer: a paged_attention batch of no sequences
    (page_table [0, P], kv_lens [0], both read on the host) on GPU arrays returns empty outputs,
    as the NumPy call does, instead of failing in the host copy."""
    jax, gpu, tj = jax_on_gpu("paged_attention")
    q = np.zeros((0, 4, 64), np.float32)
    k = np.ones((2, 16, 2, 64), np.float32)
    table, lens, cu = np.zeros((0, 2), np.int32), np.zeros((0,), np.int32), np.zeros((1,), np.int32)
    want = tessera.paged_attention(q, k, k, table, lens, cu)
    got = tj.paged_attention(*(jax.device_put(a, gpu) for a in (q, k, k, table, lens, cu)))
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert np.asarray(g).shape == w.shape


def test_jax_frozen_w_on_gpu():
    """tessera.jax with frozen="w" on GPU arrays: the CUDA FFI handler's skip attribute reaches the
    cuda implementation (dw left out), dx matches the all-gradients run and the CPU's."""
    jax, gpu, tj = jax_on_gpu("linear_cross_entropy")
    x, w, y = ref.problem(seed=6)
    xg, wg, yg = (jax.device_put(a, gpu) for a in (x, w, y.astype(np.int32)))
    loss = lambda a, b, **kw: tj.linear_cross_entropy(a, b, yg, **kw)
    dx_all, dw_all = jax.grad(loss, argnums=(0, 1))(xg, wg)
    dx, dw = jax.grad(lambda a, b: loss(a, b, frozen="w"), argnums=(0, 1))(xg, wg)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(dx_all), rtol=RTOL, atol=ATOL)
    assert not np.any(np.asarray(dw))
    want = tessera.call("linear_cross_entropy", "fused", {"x": x, "w": w, "labels": y,
                                                           "grad_loss": np.ones((), np.float32)}, skip=["dw"])
    np.testing.assert_allclose(np.asarray(dx), want["dx"], rtol=RTOL, atol=ATOL)
