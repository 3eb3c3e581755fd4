"""tessera.torch: the custom op and its autograd against PyTorch's own autodiff of the
materialized loss (F.cross_entropy on x @ w.T), torch.compile, the Liger-style module, errors."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from tessera import _ext  # noqa: E402

import reference as ref  # noqa: E402


def tensors(seed=0, dtype=torch.float32, bias=False):
    x, w, y = ref.problem(seed=seed)
    out = [torch.from_numpy(x).to(dtype).requires_grad_(), torch.from_numpy(w).to(dtype).requires_grad_(),
           torch.from_numpy(y)]
    if bias:
        out.append(torch.from_numpy(np.random.default_rng(seed).standard_normal(w.shape[0]).astype(np.float32))
                   .to(dtype).requires_grad_())
    return out


def materialized(x, w, y, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                 z_loss_weight=0.0, soft_cap=0.0):
    """The materialized loss: F.cross_entropy on the logits (+ z-loss and soft cap by hand)."""
    z = F.linear(x, w, bias).float()
    if soft_cap:
        z = soft_cap * torch.tanh(z / soft_cap)
    ce = F.cross_entropy(z, y, reduction="none", ignore_index=ignore_index, label_smoothing=label_smoothing)
    keep = y != ignore_index
    per = ce + z_loss_weight * torch.where(keep, torch.logsumexp(z, -1) ** 2, 0.0)
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.sum() / keep.sum()


def grads_of(loss_fn, args):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    loss = loss_fn(*args)
    loss.backward(torch.linspace(0.5, 2.0, loss.numel()).reshape(loss.shape) if loss.ndim else None)
    return loss.detach(), [a.grad for a in args if a.requires_grad]


OPTIONS = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"label_smoothing": 0.1},
    {"z_loss_weight": 1e-3},
    {"soft_cap": 5.0},
    {"reduction": "sum", "label_smoothing": 0.2, "z_loss_weight": 1e-2, "soft_cap": 3.0},
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_value_and_gradients_vs_autograd(opts):
    args = tensors(bias=True)
    v, g = grads_of(lambda x, w, y, b: tt.linear_cross_entropy(x, w, y, bias=b, **opts), args)
    rv, rg = grads_of(lambda x, w, y, b: materialized(x, w, y, bias=b, **opts), args)
    torch.testing.assert_close(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=2e-6)


def test_bf16_gradients_keep_the_dtype():
    x, w, y = tensors(dtype=torch.bfloat16)
    v, (gx, gw) = grads_of(lambda x, w, y: tt.linear_cross_entropy(x, w, y), [x, w, y])
    assert gx.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    rv, (rx, rw) = grads_of(lambda x, w, y: materialized(x.float(), w.float(), y), [x, w, y])
    torch.testing.assert_close(v, rv, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(gx.float(), rx.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(gw.float(), rw.float(), rtol=2e-2, atol=2e-3)


def test_transposed_weight_view_gets_its_gradient_in_its_layout():
    x, w, y = tensors()
    w_hv = w.detach().t().contiguous().requires_grad_()  # a parameter stored [H, V]
    loss = tt.linear_cross_entropy(x, w_hv.t(), y)      # passed as a [V, H] view, no copy
    loss.backward()
    rv, (_, rw) = grads_of(lambda x, w, y: materialized(x, w, y), [x, w, y])
    torch.testing.assert_close(loss.detach(), rv)
    torch.testing.assert_close(w_hv.grad.t(), rw, rtol=1e-4, atol=2e-6)


def test_opcheck():
    x, w, y, b = tensors(bias=True)
    torch.library.opcheck(torch.ops.tessera.linear_cross_entropy.default, (x, w, y, b),
                          {"reduction": "sum", "z_loss_weight": 1e-3})


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    x, w, y = tensors()
    torch._dynamo.reset()

    def step(x, w, y):
        h = torch.tanh(x) * 2  # some graph around the op
        return tt.linear_cross_entropy(h, w, y, label_smoothing=0.1)

    compiled = torch.compile(step, fullgraph=True, backend=backend)  # fullgraph: a graph break is an error
    v, g = grads_of(compiled, [x, w, y])
    rv, rg = grads_of(lambda x, w, y: materialized(torch.tanh(x) * 2, w, y, label_smoothing=0.1), [x, w, y])
    torch.testing.assert_close(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=2e-6)


def test_liger_style_module():
    x, w, y = tensors()
    loss_fn = tt.LinearCrossEntropyLoss(ignore_index=-100, lse_square_scale=1e-3, label_smoothing=0.1, softcap=4.0)
    v, g = grads_of(lambda w, x, y: loss_fn(w, x, y), [w, x, y])  # Liger's order: (lin_weight, _input, target)
    rv, rg = grads_of(lambda w, x, y: materialized(x, w, y, z_loss_weight=1e-3, label_smoothing=0.1, soft_cap=4.0),
                      [w, x, y])
    torch.testing.assert_close(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=2e-6)
    cw = torch.linspace(0.2, 2.0, w.shape[0])
    loss_fn = tt.LinearCrossEntropyLoss(ce_weight=cw, label_smoothing=0.1)  # Liger's ce_weight
    torch.testing.assert_close(loss_fn(w, x, y), F.cross_entropy(F.linear(x, w).float(), y, weight=cw,
                                                                 label_smoothing=0.1), rtol=2e-5, atol=2e-6)
    with pytest.raises(NotImplementedError, match="Liger's z-loss is not class-weighted"):
        tt.LinearCrossEntropyLoss(ce_weight=cw, lse_square_scale=1e-3)
    assert "ce_weight" in dict(loss_fn.named_buffers())
    loss, z_loss, acc = tt.LinearCrossEntropyLoss(lse_square_scale=1e-3, return_z_loss=True,
                                                  return_token_accuracy=True)(w, x, y)
    assert z_loss.shape == () and acc.shape == () and loss.requires_grad


def test_z_loss_and_token_accuracy_outputs():
    """Liger's return_z_loss / return_token_accuracy: the z-loss part alone and the argmax hit rate."""
    x, w, y = tensors(seed=7)
    y = y.clone()
    y[::5] = -100
    lam = 1e-2
    loss, z_loss, acc = tt.linear_cross_entropy(x, w, y, z_loss_weight=lam, return_z_loss=True,
                                                return_token_accuracy=True)
    logits = F.linear(x, w).detach().double()
    kept = y != -100
    lse = torch.logsumexp(logits, dim=-1)[kept]
    torch.testing.assert_close(z_loss.double(), lam * (lse ** 2).mean(), rtol=1e-5, atol=1e-7)
    hits = (logits.argmax(dim=-1)[kept] == y[kept]).double().mean()
    torch.testing.assert_close(acc.double(), hits)
    plain = tt.linear_cross_entropy(x, w, y, z_loss_weight=lam)
    torch.testing.assert_close(loss, plain, rtol=0, atol=0)  # the metrics change nothing else
    gx, = torch.autograd.grad(loss, (x,))
    px, = torch.autograd.grad(plain, (x,))
    torch.testing.assert_close(gx, px, rtol=0, atol=0)
    per_token, z_none = tt.linear_cross_entropy(x, w, y, z_loss_weight=lam, reduction="none", return_z_loss=True)
    assert z_none.shape == y.shape and float(z_none[~kept].abs().sum()) == 0.0
    assert per_token.requires_grad and not z_none.requires_grad and not acc.requires_grad  # metrics


def test_top_level_function_and_zero_copy():
    x, w, y = tensors()
    assert _ext.view(x.detach())["data"] == x.data_ptr()
    assert _ext.view(w.detach()[8:])["data"] == w.data_ptr() + 8 * w.shape[1] * 4
    loss = tessera.linear_cross_entropy(x, w, y)  # a torch tensor in, a differentiable torch tensor out
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    torch.testing.assert_close(loss.detach(), materialized(x, w, y).detach())


def test_bad_inputs_raise():
    x, w, y = tensors()
    with pytest.raises(ValueError, match=r"x must be contiguous \(row-major\)"):
        tt.linear_cross_entropy(x.detach().t().contiguous().t(), w[:, :24].contiguous(), y[:32])
    with pytest.raises(TypeError, match="w dtype bf16 differs from x dtype f32"):
        tt.linear_cross_entropy(x, w.to(torch.bfloat16), y)
    with pytest.raises(TypeError, match="float64"):
        tt.linear_cross_entropy(x.double(), w.double(), y)
    with pytest.raises(ValueError, match="outside"):
        tt.linear_cross_entropy(x, w, torch.full_like(y, 1000))
    with pytest.raises(ValueError, match="reduction must be one of"):
        tt.linear_cross_entropy(x, w, y, reduction="avg")


def test_class_weights_match_cross_entropy_weight():
    """class_weights= is F.cross_entropy's weight= (Liger's ce_weight): loss and both gradients."""
    x, w, y = tensors(seed=5)
    cw = torch.from_numpy(np.random.default_rng(5).random(w.shape[0]).astype(np.float32))
    got = tt.linear_cross_entropy(x, w, y, class_weights=cw)
    gx, gw = torch.autograd.grad(got, (x, w))
    want = F.cross_entropy(F.linear(x, w).float(), y, weight=cw, ignore_index=-100)
    wx, ww = torch.autograd.grad(want, (x, w))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(gx, wx, rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(gw, ww, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_weights_with_label_smoothing_match_cross_entropy(reduction):
    """weight= with label_smoothing=: PyTorch's own definition (the smoothing term weighted per class)."""
    x, w, y = tensors(seed=6)
    cw = torch.from_numpy(np.random.default_rng(6).random(w.shape[0]).astype(np.float32))
    cw[int(y[y != -100][0])] = 0.0  # a token whose class counts for nothing still has a smoothing term
    got = tt.linear_cross_entropy(x, w, y, class_weights=cw, label_smoothing=0.15, reduction=reduction)
    want = F.cross_entropy(F.linear(x, w).float(), y, weight=cw, ignore_index=-100,
                           label_smoothing=0.15, reduction=reduction)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)
    up = torch.rand_like(want) + 0.5
    gx, gw = torch.autograd.grad(got, (x, w), up)
    wx, ww = torch.autograd.grad(want, (x, w), up)
    torch.testing.assert_close(gx, wx, rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(gw, ww, rtol=2e-4, atol=2e-6)
