"""A small model that uses every differentiable kernel at once, trained as users train: the same
model with PyTorch's own math as the oracle, from the same initial weights.

One forward runs attention (GQA, causal, sliding window, soft cap), a top-1 mixture of experts on
grouped_matmul (both rhs layouts), an mLSTM block, an sLSTM block and the fused linear
cross-entropy head (label smoothing, z-loss, ignored tokens). The inputs reach the kernels the way
a model makes them: strided views of one projection (q, k, v split off a fused qkv; the mLSTM's
[B, NH, S, DH] a permute of [B, S, NH, DH]), and the gradients come back through reshapes and
index_copy. The unit tests check each kernel against its oracle; this checks that they compose
under autograd, torch.compile and an optimizer: loss and every parameter's gradient at the first
step, the loss over a few SGD steps, the whole model compiled as one graph, bf16 and f16 autocast against
the f32 model (no further off than PyTorch's own model under autocast), and activation
checkpointing (the same bits). test_training_jax.py does the same in JAX.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tessera.torch as tt  # noqa: E402

from devices import DEVICES  # noqa: E402

from training_model import (B, D, DH, E, FF, H, HKV, HQ, IGNORE, NH, S, SMOOTH, V, ZLOSS,  # noqa: E402
                            reference_ops, tessera_ops)


# ---- PyTorch's own math: the oracle of each op, in the kernels' contracts ----

def attention_ref(q, k, v, causal, window_left, softcap):
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[1], device=q.device)[:, None] + (k.shape[1] - q.shape[1])
    j = torch.arange(k.shape[1], device=q.device)[None, :]
    seen = (j <= i) & (j >= i - window_left)
    s = s.masked_fill(~seen, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def gmm_ref(lhs, rhs, group_sizes, transpose_rhs=False):
    out, row = [], 0
    for g, n in enumerate(group_sizes.tolist()):
        w = rhs[g].T if transpose_rhs else rhs[g]
        out.append(lhs[row:row + n] @ w)
        row += n
    return torch.cat(out)


def mlstm_ref(q, k, v, i, f, eps=1e-6):
    """h [B, NH, S, DHV], the recurrence with the stabilizer held constant (the contract's backward)."""
    b_, nh, s_, dk = q.shape
    C = q.new_zeros(b_, nh, dk, v.shape[-1])
    n, m = q.new_zeros(b_, nh, dk), q.new_zeros(b_, nh)
    hs = []
    for t in range(s_):
        logf = F.logsigmoid(f[:, :, t])
        m_new = torch.maximum(logf + m, i[:, :, t]).detach()
        Fg, Ig = torch.exp(logf + m - m_new), torch.exp(i[:, :, t] - m_new)
        C = Fg[..., None, None] * C + Ig[..., None, None] * k[:, :, t, :, None] * v[:, :, t, None, :]
        n = Fg[..., None] * n + Ig[..., None] * k[:, :, t]
        m = m_new
        qs = q[:, :, t] / math.sqrt(dk)
        den = torch.maximum((n * qs).sum(-1).abs(), torch.exp(-m)) + eps
        hs.append((C * qs[..., None]).sum(-2) / den[..., None])
    return torch.stack(hs, 2)


def slstm_ref(wx, r, b):
    """h [B, S, NH, DH] of include/tessera/slstm.h from the zero state (m held constant)."""
    b_, s_, _, nh, dh = wx.shape
    h = c = n = m = wx.new_zeros(b_, nh, dh)
    out = []
    for t in range(s_):
        pre = wx[:, t] + torch.einsum("bhj,ghjk->bghk", h, r) + b
        i, f, z, o = pre.unbind(1)
        if t == 0:   # no state yet: m = i, I = exp(i - m) = 1 with i's gradient kept, F = 0
            m_new = i.detach()
            Ig, Fg = torch.exp(i - m_new), torch.zeros_like(i)
        else:
            lsf = F.logsigmoid(f)
            m_new = torch.maximum(i, m + lsf).detach()
            Ig, Fg = torch.exp(i - m_new), torch.exp(m + lsf - m_new)
        c = Fg * c + Ig * torch.tanh(z)
        n = Fg * n + Ig
        h = c / n * torch.sigmoid(o)
        m = m_new
        out.append(h)
    return torch.stack(out, 1)


def lce_ref(x, w, labels):
    x, labels = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    z = x @ w.T
    lse = torch.logsumexp(z, -1)
    keep = labels != IGNORE
    zy = z.gather(1, labels.clamp(min=0)[:, None])[:, 0]
    per = (1 - SMOOTH) * (lse - zy) + SMOOTH * (lse - z.mean(-1)) + ZLOSS * lse**2
    return (per * keep).sum() / keep.sum()


TorchOps = reference_ops(attention_ref, gmm_ref, mlstm_ref, slstm_ref, lce_ref)


TesseraOps = tessera_ops(tt)


class Model(torch.nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        self.embed = torch.nn.Embedding(V, H)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(H) for _ in range(5))
        self.qkv = torch.nn.Linear(H, (HQ + 2 * HKV) * D)
        self.attn_out = torch.nn.Linear(HQ * D, H)
        self.router = torch.nn.Linear(H, E)
        self.w1 = torch.nn.Parameter(torch.randn(E, H, FF) / math.sqrt(H))    # [G, K, N]
        self.w2 = torch.nn.Parameter(torch.randn(E, H, FF) / math.sqrt(FF))   # [G, N, K]: transpose_rhs
        self.m_proj = torch.nn.Linear(H, 3 * NH * DH + 2 * NH)
        self.m_out = torch.nn.Linear(NH * DH, H)
        self.s_proj = torch.nn.Linear(H, 4 * NH * DH)
        self.s_r = torch.nn.Parameter(torch.randn(4, NH, DH, DH) * 0.2)
        self.s_b = torch.nn.Parameter(torch.randn(4, NH, DH) * 0.1)
        self.s_out = torch.nn.Linear(NH * DH, H)
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def attention(self, x):
        b, s = x.shape[:2]
        qkv = self.qkv(x).view(b, s, HQ + 2 * HKV, D)   # q, k, v: strided views of one projection
        q, k, v = qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]
        return self.attn_out(self.ops.attention(q, k, v).reshape(b, s, HQ * D))

    def moe(self, x):
        b, s = x.shape[:2]
        t = x.reshape(b * s, H)
        probs = self.router(t).softmax(-1)
        gate, expert = probs.max(-1)
        order = torch.argsort(expert, stable=True)
        sizes = F.one_hot(expert, E).sum(0)             # host int64, as grouped_matmul reads them
        h = F.gelu(self.ops.gmm(t[order], self.w1, sizes))
        y = self.ops.gmm(h, self.w2, sizes, transpose_rhs=True)
        return (torch.zeros_like(t).index_copy(0, order, y) * gate[:, None]).reshape(b, s, H)

    def mlstm(self, x):
        b, s = x.shape[:2]
        p = self.m_proj(x)
        qkv = p[..., :3 * NH * DH].view(b, s, 3, NH, DH).permute(2, 0, 3, 1, 4)   # [3, B, NH, S, DH]
        gates = p[..., 3 * NH * DH:].view(b, s, 2, NH).permute(2, 0, 3, 1)        # [2, B, NH, S]
        h = self.ops.mlstm(qkv[0], qkv[1], qkv[2], gates[0], gates[1] + 2.0)
        return self.m_out(h.transpose(1, 2).reshape(b, s, NH * DH))

    def slstm(self, x):
        b, s = x.shape[:2]
        wx = self.s_proj(x).view(b, s, 4, NH, DH)
        return self.s_out(self.ops.slstm(wx, self.s_r, self.s_b).reshape(b, s, NH * DH))

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for norm, block in zip(self.norms, (self.attention, self.moe, self.mlstm, self.slstm)):
            x = x + block(norm(x))
        return self.ops.lce(self.norms[-1](x), self.lm_head.weight, labels)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, V, (B, S), generator=g)
    labels = (tokens * 7 + 3) % V
    labels[:, -1] = IGNORE                             # ignored tokens
    return tokens, labels


def twins(device="cpu"):
    """Tessera's model on `device` and PyTorch's own model on the CPU (the f32 oracle), from the
    same weights."""
    torch.manual_seed(0)
    mine = Model(TesseraOps)
    ref = Model(TorchOps)
    ref.load_state_dict(mine.state_dict())
    return mine.to(device), ref


def gradients(model, step=0, loss_fn=None, device="cpu"):
    """The loss and every parameter's gradient (on the CPU) of one batch on `device`, where the
    model's parameters are."""
    model.zero_grad(set_to_none=True)
    loss = (model if loss_fn is None else loss_fn)(*(t.to(device) for t in batch(step)))
    loss.backward()
    return loss.item(), {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}


def assert_gradients_close(got, want, rtol, what):
    assert got.keys() == want.keys()
    for name in want:
        g, w = got[name], want[name]
        assert g is not None, f"{what}: {name} got no gradient"
        scale = w.abs().max().item()
        err = (g - w).abs().max().item()
        assert err <= rtol * scale + 1e-7, f"{what}: {name}: max |Δ| {err:.3g} against max |grad| {scale:.3g}"


# Gradients against PyTorch's f32 model on the CPU, of each gradient's largest entry. CPU: the
# kernels sum in other orders (tiles, chunks) than the einsums; measured on a Zen 4 at most 6.2e-7,
# 1e-5 leaves 16x. CUDA: as test_cuda.py, 2e-3 also covers f32 products in TF32 (2^-11 each). A
# gradient lost at one step of one kernel (the sLSTM's i at t = 0, say) is off by 1e-1 everywhere
# upstream of it.
RTOL = {"cpu": 1e-5, "cuda": 2e-3}


@pytest.mark.parametrize("device", DEVICES)
def test_first_step_loss_and_every_gradient_match_pytorch(device):
    mine, ref = twins(device)
    loss, grads = gradients(mine, device=device)
    want_loss, want = gradients(ref)
    assert loss == pytest.approx(want_loss, rel=RTOL[device])
    assert_gradients_close(grads, want, RTOL[device], device)
    assert all(g.abs().max() > 0 for g in want.values())   # every kernel's gradient reached a weight


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_steps_follow_pytorch(device):
    mine, ref = twins(device)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (mine, ref)]
    losses = [[], []]
    for step in range(6):
        for m, opt, out, dev in zip((mine, ref), opts, losses, (device, "cpu")):
            opt.zero_grad(set_to_none=True)
            loss = m(*(t.to(dev) for t in batch(step)))
            loss.backward()
            opt.step()
            out.append(loss.item())
    np.testing.assert_allclose(losses[0], losses[1], rtol=max(1e-4, RTOL[device]))
    assert losses[0][-1] < losses[0][0]                    # it learns (the rule is learnable)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_accumulation_over_micro_batches(device):
    """Two micro-batches of one sequence each, each loss halved, gradients accumulated by two
    backward calls (the LCE head's fused pass saved its gradients in the forward and scales them
    by the upstream 0.5): the whole batch's gradients. Each sequence has as many kept tokens as the
    other, so the mean of the two means is the batch's mean."""
    mine, _ = twins(device)
    _, want = gradients(mine, device=device)
    mine.zero_grad(set_to_none=True)
    tokens, labels = (t.to(device) for t in batch(0))
    for i in range(B):
        (mine(tokens[i:i + 1], labels[i:i + 1]) / B).backward()
    got = {n: p.grad.detach().cpu() for n, p in mine.named_parameters()}
    assert_gradients_close(got, want, RTOL[device], "accumulated")


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_of_the_whole_model_matches_eager(device):
    mine, _ = twins(device)
    loss, grads = gradients(mine, device=device)
    compiled = torch.compile(mine, fullgraph=True)   # every kernel and its backward in one graph
    got_loss, got = gradients(mine, loss_fn=compiled, device=device)
    assert got_loss == pytest.approx(loss, rel=1e-6 if device == "cpu" else RTOL[device])
    assert_gradients_close(got, grads, RTOL[device], "compiled")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,bound", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_autocast_stays_as_close_to_f32_as_pytorch_does(dtype, bound, device):
    """Under torch.autocast the kernels take 16-bit operands (x and w, q, k and v, lhs and rhs,
    ...) as a matmul would. Against the f32 model's gradients, Tessera's model must be no further
    off than PyTorch's own model under the same autocast on the same device. Measured on a Zen 4,
    of a gradient's largest entry: bf16 Tessera 1.3e-2, PyTorch 8.5e-2 (its mLSTM recurrence runs
    in bf16 arithmetic; the kernels accumulate in f32 and the loss is f32); f16 1.3e-3 and 2.6e-3."""
    mine, ref = twins(device)
    want_loss, truth = gradients(ref)
    worst = {}
    for name, model in (("tessera", mine), ("torch", ref.to(device))):
        with torch.autocast(device, dtype=dtype):
            loss, grads = gradients(model, device=device)
        worst[name] = max(((grads[n] - truth[n]).abs().max() / truth[n].abs().max()).item() for n in truth)
        if name == "tessera":
            assert loss == pytest.approx(want_loss, rel=1e-3)
    assert 1e-4 < worst["tessera"] < bound, worst   # 16-bit operands did reach the kernels (f32: ~1e-7)
    assert worst["tessera"] <= worst["torch"], worst


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_model_stays_as_close_to_f32_as_pytorch_does(device):
    """The model cast to bf16 (`model.to(torch.bfloat16)`, as a checkpoint loaded in bf16 is):
    every kernel takes bf16 operands and must hand the next bf16 layer bf16 (the sLSTM's h came
    back in f32 until 2026-11-29: the next nn.Linear refused it). Against the f32 model's
    gradients, no further off than PyTorch's own model in bf16. Measured on a Zen 4, of a
    gradient's largest entry: Tessera 1.4e-2, PyTorch 2.3e-2."""
    mine, ref = twins(device)
    _, truth = gradients(ref)
    worst = {}
    for name, model in (("tessera", mine), ("torch", ref.to(device))):
        loss, grads = gradients(model.to(torch.bfloat16), device=device)
        assert all(g.dtype == torch.bfloat16 for g in grads.values())
        worst[name] = max(((grads[n].float() - truth[n]).abs().max() / truth[n].abs().max()).item() for n in truth)
    assert 1e-4 < worst["tessera"] <= worst["torch"], worst


@pytest.mark.parametrize("device", DEVICES)
def test_f16_autocast_with_a_grad_scaler_trains_as_f32_does(device):
    """f16 mixed precision as users train with it: torch.autocast(float16) and a GradScaler that
    multiplies the loss by 2^16 (the fused LCE head scales its saved gradients by it in f32 and
    rounds once). Six SGD steps: the losses of the f32 run. Measured on a Zen 4: within 2e-5
    relative at every step and no step skipped (the scale stays 2^16), where PyTorch's own model
    under the same scaler skipped one (an inf gradient) and drifted by 1e-2."""
    def train(model, amp):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16, enabled=amp)
        losses = []
        for step in range(6):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.float16, enabled=amp):
                loss = model(*(t.to(device) for t in batch(step)))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        return losses, scaler.get_scale() if amp else None

    mixed, scale = train(twins(device)[0], True)
    full, _ = train(twins(device)[0], False)
    np.testing.assert_allclose(mixed, full, rtol=1e-3)
    if device == "cpu":
        assert scale == 2.0 ** 16          # no step skipped for an inf or NaN gradient


class Checkpointed(torch.nn.Module):
    """The model with every block and the head under activation checkpointing: the forward runs
    again in the backward (the LCE head's fused pass included, which computes its gradients in the
    forward)."""

    def __init__(self, model, use_reentrant):
        super().__init__()
        self.m, self.use_reentrant = model, use_reentrant

    def forward(self, tokens, labels):
        from torch.utils.checkpoint import checkpoint
        m = self.m
        x = m.embed(tokens)
        for norm, block in zip(m.norms, (m.attention, m.moe, m.mlstm, m.slstm)):
            x = x + checkpoint(lambda a, n=norm, b=block: b(n(a)), x, use_reentrant=self.use_reentrant)
        head = lambda a: m.ops.lce(m.norms[-1](a), m.lm_head.weight, labels)  # noqa: E731
        return checkpoint(head, x, use_reentrant=self.use_reentrant)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_gives_the_same_bits(use_reentrant, device):
    """The CPU kernels are deterministic: the same bits. A CUDA backward may sum with atomics
    (another order on each run): there within 1e-6 of each gradient's largest entry."""
    mine, _ = twins(device)
    loss, grads = gradients(mine, device=device)
    got_loss, got = gradients(mine, loss_fn=Checkpointed(mine, use_reentrant), device=device)
    if device == "cpu":
        assert got_loss == loss
        for name in grads:
            torch.testing.assert_close(got[name], grads[name], rtol=0, atol=0, msg=name)
    else:
        assert got_loss == pytest.approx(loss, rel=1e-6)
        assert_gradients_close(got, grads, 1e-6, "checkpointed")
