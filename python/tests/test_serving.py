"""The serving counterpart of test_training.py: a generation loop as an inference server runs it,
on the forward-only kernels, with PyTorch's own math (float64) as the oracle at every step.

- paged_attention under continuous batching: a tiny one-layer language model generates greedily
  from a pool of pages handed out in a shuffled order. Step 0 prefills three prompts in one
  ragged call; later steps decode one token per sequence, a new sequence joins mid-way with a
  chunked prefill in the same call as the others' decodes (mixed prefill + decode, a prefill
  chunk bottom-right aligned behind keys already cached), one sequence finishes and its pages
  are NaN-filled and handed to the newcomer, and the rows of each call come in a shuffled
  sequence order. At every step o and lse of every row are checked against (a) the softmax over
  that sequence's keys so far in float64 (causal, bottom-right aligned), (b) tessera.torch.attention
  varlen over the same keys gathered into a contiguous buffer (sinks folded into its lse), and
  (c) the same step on a freshly built contiguous cache. Variants: plain causal, sliding window +
  softcap, sinks (one of them -inf). At the end the generated tokens equal those of a naive
  server that recomputes the whole sequence at every step in float64 (no cache).
- mla_decode in a decode loop with speculative steps (Sq = 2 and 3, causal, then rollback of the
  rejected drafts, whose slots are NaN-filled): the latent cache [P, page_size, 1, Dlatent + Drope] grows
  in place; at every step o and lse against the contract's math (scores over all D dims, values
  the first dv) and against DeepSeek's un-absorbed MLA (per-head keys c·W_uk ++ k_rope, values
  c·W_uv), which the absorbed form must equal.
- torch.compile(fullgraph=True) of a decode step that writes the new token into the cache in
  place and calls paged_attention: eager's results, and after the cache (and kv_lens) changed in
  place, the new results, not the first call's.
"""
import math

import pytest

torch = pytest.importorskip("torch")

import tessera.torch as tt  # noqa: E402

from devices import DEVICES  # noqa: E402

NAN = float("nan")
F64 = torch.float64

# On CUDA the caches live on the device and are written there in place; the checks run on the
# CPU, in float64.


def tol(device, cpu):
    """A bound measured on the CPU (f32 kernels, ~10x margin), or 1e-4 on CUDA: other summation
    orders and the device's exp; a key read from a wrong slot or page, a missed window or sink or
    a NaN slot read is off by O(1) or NaN either way."""
    return cpu if device == "cpu" else max(cpu, 1e-4)


def max_err(got, want):
    """Largest |got - want| over finite entries; +inf where the two disagree on being finite."""
    got, want = got.to(F64), want.to(F64)
    if not torch.equal(torch.isfinite(got), torch.isfinite(want)):
        return math.inf
    same_inf = ~torch.isfinite(want)
    if same_inf.any() and not torch.equal(got[same_inf], want[same_inf]):
        return math.inf
    d = (got - want)[torch.isfinite(want)].abs()
    return d.max().item() if d.numel() else 0.0


# ---------------------------------------------------------------------------------------------
# 1. paged_attention under continuous batching
# ---------------------------------------------------------------------------------------------

VOCAB, HID = 64, 32
HQ, HKV, D, DV = 4, 2, 16, 8        # GQA 2:1, Dv != D
PAGE, POOL, MAX_PAGES = 4, 16, 8     # page_size, pages in the pool, page-table width
MAX_POS = MAX_PAGES * PAGE

VARIANTS = {
    "causal": dict(),
    "window_softcap": dict(window=5, softcap=2.0),
    "sinks": dict(sinks=[0.7, -1.5, float("-inf"), 2.5]),
}

# The requests: prompt length, tokens to generate, the step at which they arrive and the longest
# prefill chunk the scheduler gives them per step (None: the whole prompt at once).
REQUESTS = {
    "A": dict(prompt=5, new=7, arrive=0, chunk=None),
    "B": dict(prompt=9, new=6, arrive=0, chunk=None),
    "C": dict(prompt=6, new=2, arrive=0, chunk=None),   # 7 tokens cached: 2 pages, then freed
    "D": dict(prompt=7, new=4, arrive=2, chunk=4),      # joins after C left: reuses its pages
}


class TinyLM:
    """One attention layer: x = embed[token] + pos[position], q/k/v projections, next token =
    argmax((o ++ x) @ w_out). Weights kept in float64; f32 copies feed the kernels."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
        self.embed = r(VOCAB, HID)
        self.pos = 0.5 * r(MAX_POS, HID)
        # scores q·k/√D of a few units: the softcap (2.0) bites and the softmax is not flat
        self.wq = 1.5 * r(HID, HQ * D) / math.sqrt(HID)
        self.wk = 1.5 * r(HID, HKV * D) / math.sqrt(HID)
        self.wv = r(HID, HKV * DV) / math.sqrt(HID)
        self.w_out = r(HQ * DV + HID, VOCAB)

    def qkv(self, tokens, positions, dtype):
        x = (self.embed[tokens] + self.pos[positions]).to(dtype)
        q = (x @ self.wq.to(dtype)).view(-1, HQ, D)
        k = (x @ self.wk.to(dtype)).view(-1, HKV, D)
        v = (x @ self.wv.to(dtype)).view(-1, HKV, DV)
        return q, k, v, x

    def next_token(self, o_row, x_row):
        logits = torch.cat([o_row.reshape(-1).to(F64), x_row.to(F64)]) @ self.w_out
        top2 = logits.topk(2).values
        return int(logits.argmax()), (top2[0] - top2[1]).item()


def attention_f64(q, k, v, causal=True, window=-1, softcap=0.0, sinks=None):
    """One sequence: q [ql, Hq, D] at positions L - ql .. L - 1, k [L, Hkv, D], v [L, Hkv, Dv].
    Returns o [ql, Hq, Dv] and lse [ql, Hq] in float64 (the contract of include/tessera/paged_attention.h)."""
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    ql, hq, d = q.shape
    L = k.shape[0]
    rep = hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(ql)[:, None] + (L - ql)
    j = torch.arange(L)[None, :]
    seen = torch.ones(ql, L, dtype=torch.bool)
    if causal:
        seen &= j <= pos
    if window >= 0:
        seen &= j >= pos - window
    s = s.masked_fill(~seen, float("-inf"))
    logits = s
    if sinks is not None:   # one more logit per row, as given, carrying no value
        sink = torch.as_tensor(sinks, dtype=F64)[:, None, None].expand(hq, ql, 1)
        logits = torch.cat([s, sink], -1)
    lse = torch.logsumexp(logits, -1)                        # [Hq, ql]
    o = torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]), v)
    return o, lse.T


class PagedServer:
    """Continuous batching over a paged KV cache, as vLLM-style servers do it."""

    def __init__(self, model, opts, seed, device="cpu"):
        self.model, self.opts, self.dev = model, opts, device
        self.g = torch.Generator().manual_seed(seed)
        self.k_cache = torch.full((POOL, PAGE, HKV, D), NAN, device=device)   # never-written slots are NaN
        self.v_cache = torch.full((POOL, PAGE, HKV, DV), NAN, device=device)
        self.free = torch.randperm(POOL, generator=self.g).tolist()   # pages in a shuffled order
        self.running = {}
        self.finished = {}
        self.freed_by = {}       # page -> name of the sequence that freed it
        self.reused = []         # (page, previous owner, new owner)
        self.errors = {}         # check -> largest error over every step and row
        self.steps = 0
        self.mixed_steps = 0     # calls with a prefill chunk and decode rows together
        self.nan_tails = 0       # calls that read a reused page holding NaN past kv_len

    def add(self, name, prompt, new, chunk):
        self.running[name] = dict(tokens=list(prompt), n_prompt=len(prompt), new=new, chunk=chunk,
                                  cached=0, pages=[], k=[], v=[], margins=[])

    def _page_of(self, seq, p):
        while p // PAGE >= len(seq["pages"]):
            page = self.free.pop()     # LIFO: the pages freed last go out first
            if page in self.freed_by:
                self.reused.append((page, self.freed_by.pop(page), seq["name"]))
            seq["pages"].append(page)
        return seq["pages"][p // PAGE], p % PAGE

    def _note(self, what, err):
        self.errors[what] = max(self.errors.get(what, 0.0), err)

    def step(self):
        # The scheduler: every running sequence gives its next prefill chunk, or its last token.
        names = list(self.running)
        order = torch.randperm(len(names), generator=self.g).tolist()   # rows in any sequence order
        batch = []
        for name in (names[i] for i in order):
            seq = self.running[name]
            seq["name"] = name
            todo = len(seq["tokens"]) - seq["cached"]
            take = todo if seq["chunk"] is None else min(todo, seq["chunk"])
            batch.append((name, seq, seq["cached"], take))
        kinds = {"prefill" if take > 1 or seq["cached"] < seq["n_prompt"] else "decode"
                 for _, seq, _, take in batch}
        self.mixed_steps += kinds == {"prefill", "decode"}

        # Project the new tokens and write their keys and values into the cache, in place.
        qs, cu, kv_lens = [], [0], []
        page_table = torch.full((len(batch), MAX_PAGES), -1, dtype=torch.int32)  # unused: -1
        for b, (name, seq, start, take) in enumerate(batch):
            positions = torch.arange(start, start + take)
            q, k, v, x = self.model.qkv(torch.tensor(seq["tokens"][start:start + take]), positions,
                                        torch.float32)
            slots = [self._page_of(seq, int(p)) for p in positions]
            pg, sl = torch.tensor([p for p, _ in slots]), torch.tensor([s for _, s in slots])
            self.k_cache[pg.to(self.dev), sl.to(self.dev)] = k.to(self.dev)
            self.v_cache[pg.to(self.dev), sl.to(self.dev)] = v.to(self.dev)
            seq["k"].append(k)
            seq["v"].append(v)
            seq["cached"] += take
            seq["x_last"] = x[-1]
            qs.append(q)
            cu.append(cu[-1] + take)
            kv_lens.append(seq["cached"])
            page_table[b, :len(seq["pages"])] = torch.tensor(seq["pages"], dtype=torch.int32)
        q = torch.cat(qs)
        cu_q = torch.tensor(cu, dtype=torch.int32)
        kv = torch.tensor(kv_lens, dtype=torch.int32)
        kw = dict(causal=True, window=self.opts.get("window", -1), softcap=self.opts.get("softcap", 0.0))
        sinks = self.opts.get("sinks")
        sinks_t = None if sinks is None else torch.tensor(sinks, dtype=torch.float32)
        dev = lambda *ts: [None if t is None else t.to(self.dev) for t in ts]  # noqa: E731
        host = lambda *ts: [t.cpu() for t in ts]  # noqa: E731

        for (name, seq, _, _), n in zip(batch, kv_lens):
            last = seq["pages"][-1]
            if n % PAGE and any(last == p for p, _, new in self.reused if new == name):
                assert torch.isnan(self.k_cache[last, n % PAGE:]).all()
                self.nan_tails += 1
        q_d, pt_d, kv_d, cu_d, sinks_d = dev(q, page_table, kv, cu_q, sinks_t)
        o, lse = host(*tt.paged_attention(q_d, self.k_cache, self.v_cache, pt_d, kv_d, cu_d,
                                          sinks=sinks_d, return_lse=True, **kw))
        assert o.shape == (q.shape[0], HQ, DV) and lse.shape == (q.shape[0], HQ)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()

        # (a) the float64 softmax over each sequence's keys so far
        for b, (name, seq, start, take) in enumerate(batch):
            rows = slice(cu[b], cu[b + 1])
            k_all, v_all = torch.cat(seq["k"]), torch.cat(seq["v"])
            want_o, want_lse = attention_f64(q[rows], k_all, v_all, window=kw["window"],
                                             softcap=kw["softcap"], sinks=sinks)
            self._note("o vs float64", max_err(o[rows], want_o))
            self._note("lse vs float64", max_err(lse[rows], want_lse))

        # (b) tessera.torch.attention, varlen, on the keys gathered into one contiguous buffer
        k_flat = torch.cat([torch.cat(seq["k"]) for _, seq, _, _ in batch])
        v_flat = torch.cat([torch.cat(seq["v"]) for _, seq, _, _ in batch])
        cu_k = torch.tensor([0] + kv_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        a_o, a_lse = host(*tt.attention(*dev(q, k_flat, v_flat), cu_seqlens_q=cu_d, cu_seqlens_k=dev(cu_k)[0],
                                        causal=True, window_left=kw["window"], softcap=kw["softcap"],
                                        return_lse=True))
        a_lse = a_lse.T                                       # [Hq, T] (FlashAttention's) -> [T, Hq]
        if sinks is not None:   # a sink is one more logit: lse' = logaddexp(lse, σ), o' = o·e^(lse - lse')
            with_sink = torch.logaddexp(a_lse, sinks_t[None, :])
            a_o, a_lse = a_o * torch.exp(a_lse - with_sink)[..., None], with_sink
        self._note("o vs attention", max_err(o, a_o))
        self._note("lse vs attention", max_err(lse, a_lse))

        # (c) the same step on a freshly built contiguous cache (pages 0, 1, 2, ... in order)
        n_pages = [-(-n // PAGE) for n in kv_lens]
        k2 = torch.full((sum(n_pages) + 1, PAGE, HKV, D), NAN)
        v2 = torch.full((sum(n_pages) + 1, PAGE, HKV, DV), NAN)
        pt2 = torch.full_like(page_table, -1)
        base = 0
        for b, (_, seq, _, _) in enumerate(batch):
            n = kv_lens[b]
            k2.view(-1, HKV, D)[base * PAGE:base * PAGE + n] = torch.cat(seq["k"])
            v2.view(-1, HKV, DV)[base * PAGE:base * PAGE + n] = torch.cat(seq["v"])
            pt2[b, :n_pages[b]] = torch.arange(base, base + n_pages[b], dtype=torch.int32)
            base += n_pages[b]
        c_o, c_lse = host(*tt.paged_attention(*dev(q, k2, v2, pt2, kv, cu_q), sinks=sinks_d, return_lse=True,
                                              **kw))
        self._note("o vs contiguous cache", max_err(o, c_o))
        self._note("lse vs contiguous cache", max_err(lse, c_lse))

        # Sample: a sequence whose prompt is all cached emits a token from its last row.
        for b, (name, seq, start, take) in enumerate(batch):
            if seq["cached"] < seq["n_prompt"]:
                continue                                       # mid-prefill: no token yet
            tok, margin = self.model.next_token(o[cu[b + 1] - 1], seq["x_last"])
            seq["tokens"].append(tok)
            seq["margins"].append(margin)
            if len(seq["tokens"]) - seq["n_prompt"] == seq["new"]:
                self._finish(name)
        self.steps += 1

    def _finish(self, name):
        seq = self.running.pop(name)
        for page in seq["pages"]:          # freed pages: NaN, so that a read of a stale slot shows
            self.k_cache[page] = NAN
            self.v_cache[page] = NAN
            self.freed_by[page] = name
            self.free.append(page)
        self.finished[name] = seq


def naive_generation(model, prompt, new, opts):
    """No cache, no batching: recompute the whole sequence in float64 at every step."""
    tokens = list(prompt)
    while len(tokens) - len(prompt) < new:
        q, k, v, x = model.qkv(torch.tensor(tokens), torch.arange(len(tokens)), F64)
        o, _ = attention_f64(q, k, v, window=opts.get("window", -1), softcap=opts.get("softcap", 0.0),
                             sinks=opts.get("sinks"))
        tokens.append(model.next_token(o[-1], x[-1])[0])
    return tokens


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_paged_attention_continuous_batching(variant, device):
    opts = VARIANTS[variant]
    model = TinyLM(seed=0)
    server = PagedServer(model, opts, seed=1, device=device)
    g = torch.Generator().manual_seed(2)
    prompts = {n: torch.randint(0, VOCAB, (r["prompt"],), generator=g).tolist() for n, r in REQUESTS.items()}
    while server.running or len(server.finished) < len(REQUESTS):
        for name, r in REQUESTS.items():
            if r["arrive"] == server.steps:
                server.add(name, prompts[name], r["new"], r["chunk"])
        server.step()
        assert server.steps < 20

    # The schedule did what it is meant to test.
    assert server.steps == 7                               # A's 7 tokens: a prefill, 6 decodes
    assert server.mixed_steps >= 2                         # D's two prefill chunks beside decodes
    assert any(old == "C" and new == "D" for _, old, new in server.reused), server.reused
    print(f"\n{variant}: " + ", ".join(f"{k} {v:.2g}" for k, v in server.errors.items()))

    # Largest |error| over every step and row, measured on a 2-core x86 CPU (f32 kernels):
    #   variant          |o|, |lse| up to   vs float64 (o, lse)   vs attention (o, lse)   vs contiguous
    #   causal           4.0, 8.4           6.5e-7, 9.8e-7        1.4e-6, 9.5e-7          0, 0
    #   window_softcap   2.7, 3.2           3.3e-7, 2.8e-7        3.6e-7, 2.7e-7          0, 0
    #   sinks            3.5, 8.4           6.3e-7, 9.7e-7        7.2e-7, 1.4e-6          0, 0
    # One or two f32 ulps of the values (ulp 4.8e-7 in [4, 8), 9.5e-7 in [8, 16)). Asserted with
    # ~10x margin; a key read from a wrong slot or page, a missed window or sink, or a NaN slot
    # read is off by O(1) or NaN. The contiguous cache gave the same bits (the cpu kernel follows
    # key positions, not page ids); 2e-6 (2 ulps of lse) leaves room for another blocking.
    err = server.errors
    t64, tatt, tcont = tol(device, 1e-5), tol(device, 1.5e-5), tol(device, 2e-6)
    assert err["o vs float64"] < t64 and err["lse vs float64"] < t64, err
    assert err["o vs attention"] < tatt and err["lse vs attention"] < tatt, err
    assert err["o vs contiguous cache"] < tcont and err["lse vs contiguous cache"] < tcont, err
    assert server.nan_tails > 0          # a reused page's slots past kv_len held NaN during a call

    # The generated tokens are the naive float64 server's. Smallest argmax margins (top-1 minus
    # top-2 logit): causal 0.13, window_softcap 0.0054, sinks 0.21, against logit errors of
    # ~1e-5 from the kernels' ~1e-6.
    margins = [m for seq in server.finished.values() for m in seq["margins"]]
    print(f"{variant}: smallest argmax margin {min(margins):.3g}")
    for name, seq in server.finished.items():
        r = REQUESTS[name]
        assert seq["tokens"] == naive_generation(model, prompts[name], r["new"], opts), name


# ---------------------------------------------------------------------------------------------
# 2. mla_decode: a decode loop with speculative steps
# ---------------------------------------------------------------------------------------------

MLA_HQ, DLAT, DROPE, DNOPE, DVH = 4, 32, 8, 16, 16   # heads, latent, rope, per-head q/k nope, v head
MLA_D = DLAT + DROPE                                  # 40: DeepSeek's 512 + 64 = 576 in miniature
MLA_PAGE, MLA_POOL, MLA_MAX_PAGES = 4, 24, 8


def rope(x, positions):
    """Rotary embedding on the last dim (pairs (2i, 2i+1)); x [n, ..., R], positions [n]."""
    r = x.shape[-1]
    freq = 1.0 / (100.0 ** (torch.arange(0, r, 2, dtype=F64) / r))
    ang = positions.to(F64)[:, None] * freq[None, :]                    # [n, R/2]
    shape = [ang.shape[0]] + [1] * (x.dim() - 2) + [ang.shape[1]]
    cos, sin = torch.cos(ang).view(shape).to(x.dtype), torch.sin(ang).view(shape).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


class TinyMLA:
    """DeepSeek's MLA in miniature: the latent c = x·W_dkv (DLAT), k_rope = rope(x·W_kr) shared by
    the heads, per-head q_nope, q_rope; keys c·W_uk[h] ++ k_rope, values c·W_uv[h]. The absorbed
    form caches c ++ k_rope (D = 40) and queries with W_uk[h]·q_nope ++ q_rope."""

    def __init__(self, seed=3):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
        self.embed = r(VOCAB, HID)
        self.w_dkv = r(HID, DLAT) / math.sqrt(HID)
        self.w_kr = r(HID, DROPE) / math.sqrt(HID)
        self.w_qn = 2.0 * r(HID, MLA_HQ, DNOPE) / math.sqrt(HID)
        self.w_qr = 2.0 * r(HID, MLA_HQ, DROPE) / math.sqrt(HID)
        self.w_uk = r(MLA_HQ, DLAT, DNOPE) / math.sqrt(DLAT)
        self.w_uv = r(MLA_HQ, DLAT, DVH) / math.sqrt(DLAT)
        self.scale = 1.0 / math.sqrt(DNOPE + DROPE)     # the model's head dim, not the latent's

    def latent(self, tokens, positions):                 # [n, D]: what the cache holds
        x = self.embed[tokens]
        return torch.cat([x @ self.w_dkv, rope(x @ self.w_kr, positions)], -1)

    def queries(self, tokens, positions):               # q_nope [n, H, DNOPE], q_rope [n, H, DROPE]
        x = self.embed[tokens]
        return torch.einsum("nc,chd->nhd", x, self.w_qn), rope(torch.einsum("nc,chd->nhd", x, self.w_qr), positions)

    def absorbed_q(self, q_nope, q_rope):                # [n, H, D]
        return torch.cat([torch.einsum("nhd,hcd->nhc", q_nope, self.w_uk), q_rope], -1)


def mla_contract_f64(q, lat, dv, scale, causal):
    """The contract: q [Sq, H, D], lat [L, D]; s = scale·q·c over all D dims, values c[:, :dv]."""
    q, lat = q.to(F64), lat.to(F64)
    sq, L = q.shape[0], lat.shape[0]
    s = scale * torch.einsum("qhd,kd->hqk", q, lat)
    if causal:
        pos = torch.arange(sq)[:, None] + (L - sq)
        s = s.masked_fill(torch.arange(L)[None, :] > pos, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hqk,kd->qhd", torch.exp(s - lse[..., None]), lat[:, :dv])
    return o, lse.T                                      # [Sq, H, dv], [Sq, H]


def mla_materialized_f64(model, q_nope, q_rope, lat, causal):
    """DeepSeek's MLA without absorption: per-head keys and values built from the latent.
    Returns o [Sq, H, DVH] (per-head value space) and lse [Sq, H]."""
    c, k_rope = lat[:, :DLAT].to(F64), lat[:, DLAT:].to(F64)
    sq, L = q_nope.shape[0], lat.shape[0]
    k_nope = torch.einsum("kc,hcd->khd", c, model.w_uk)                  # [L, H, DNOPE]
    v = torch.einsum("kc,hcd->khd", c, model.w_uv)                       # [L, H, DVH]
    s = model.scale * (torch.einsum("qhd,khd->hqk", q_nope, k_nope) + torch.einsum("qhr,kr->hqk", q_rope, k_rope))
    if causal:
        pos = torch.arange(sq)[:, None] + (L - sq)
        s = s.masked_fill(torch.arange(L)[None, :] > pos, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]), v), lse.T


@pytest.mark.parametrize("device", DEVICES)
def test_mla_decode_loop_with_speculative_steps(device):
    model = TinyMLA()
    g = torch.Generator().manual_seed(4)
    cache = torch.full((MLA_POOL, MLA_PAGE, 1, MLA_D), NAN, device=device)
    free = torch.randperm(MLA_POOL, generator=g).tolist()
    prompts = [7, 2]                                    # tokens cached before the loop (the prefill)
    seqs = [dict(tokens=torch.randint(0, VOCAB, (n,), generator=g).tolist(), pages=[], L=0) for n in prompts]

    def write(seq, new_tokens):
        """Append tokens' latents to the cache in place: cache[page, slot] = latent."""
        pos = torch.arange(seq["L"], seq["L"] + len(new_tokens))
        lat = model.latent(torch.tensor(new_tokens), pos).float()
        for p, row in zip(pos.tolist(), lat):
            while p // MLA_PAGE >= len(seq["pages"]):
                seq["pages"].append(free.pop())
            cache[seq["pages"][p // MLA_PAGE], p % MLA_PAGE, 0] = row.to(device)
        seq["tokens"] = seq["tokens"][:seq["L"]] + list(new_tokens)
        seq["L"] += len(new_tokens)

    for seq in seqs:
        toks, seq["tokens"] = seq["tokens"], []
        write(seq, toks)

    # (Sq, tokens each sequence keeps afterwards). Sq > 1: a speculative step (the last token
    # and Sq - 1 drafts checked causally in one call), after which the rejected drafts are rolled
    # back: L shrinks and their slots become NaN (step 8 reads a page with such a slot past L).
    schedule = [(1, [1, 1]), (1, [1, 1]), (3, [3, 3]), (1, [1, 1]), (3, [1, 3]), (2, [1, 2]),
                (1, [1, 1]), (3, [2, 1]), (1, [1, 1])]
    errs = {}
    note = lambda what, e: errs.__setitem__(what, max(errs.get(what, 0.0), e))  # noqa: E731
    causal_steps = 0
    for sq, keeps in schedule:
        drafts = [torch.randint(0, VOCAB, (sq,), generator=g).tolist() for _ in seqs]
        for seq, d in zip(seqs, drafts):
            write(seq, d)
        page_table = torch.full((len(seqs), MLA_MAX_PAGES), -1, dtype=torch.int32)
        for b, seq in enumerate(seqs):
            page_table[b, :len(seq["pages"])] = torch.tensor(seq["pages"], dtype=torch.int32)
        lens = torch.tensor([seq["L"] for seq in seqs], dtype=torch.int32)
        qn, qr, qa = [], [], []
        for seq, d in zip(seqs, drafts):
            n, r_ = model.queries(torch.tensor(d), torch.arange(seq["L"] - sq, seq["L"]))
            qn.append(n)
            qr.append(r_)
            qa.append(model.absorbed_q(n, r_))
        q = torch.stack(qa).float()                                       # [B, Sq, H, D]
        causal = sq > 1
        causal_steps += causal
        o, lse = tt.mla_decode(q.to(device), cache, page_table.to(device), lens.to(device), dv=DLAT, causal=causal,
                               scale=model.scale)
        o, lse = o.cpu(), lse.cpu()
        assert o.shape == (len(seqs), sq, MLA_HQ, DLAT) and lse.shape == (len(seqs), sq, MLA_HQ)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
        for b, seq in enumerate(seqs):
            lat = model.latent(torch.tensor(seq["tokens"]), torch.arange(seq["L"])).float()
            want_o, want_lse = mla_contract_f64(q[b], lat, DLAT, model.scale, causal)
            note("o vs contract", max_err(o[b], want_o))
            note("lse vs contract", max_err(lse[b], want_lse))
            # The absorbed output mapped to each head's value space is the un-absorbed MLA's.
            mo, mlse = mla_materialized_f64(model, qn[b], qr[b], lat, causal)
            o_heads = torch.einsum("qhc,hcd->qhd", o[b].to(F64), model.w_uv)
            note("o·W_uv vs materialized MLA", max_err(o_heads, mo))
            note("lse vs materialized MLA", max_err(lse[b], mlse))
        # Verification: keep the accepted drafts, roll back the rest (their slots: NaN).
        for seq, keep in zip(seqs, keeps):
            for p in range(seq["L"] - sq + keep, seq["L"]):
                cache[seq["pages"][p // MLA_PAGE], p % MLA_PAGE] = NAN
            seq["L"] -= sq - keep
            seq["tokens"] = seq["tokens"][:seq["L"]]

    assert causal_steps == 4 and [s["L"] for s in seqs] == [7 + 12, 2 + 14]
    print("\nmla_decode: " + ", ".join(f"{k} {v:.2g}" for k, v in errs.items()))
    # Largest |error| over every step, measured on a 2-core x86 CPU (f32 kernel; |o| up to 3.7,
    # |lse| up to 8.8): o 7.8e-7, lse 7.4e-7 against the contract; o·W_uv 8.5e-7, lse 7.0e-7
    # against the materialized MLA (which also carries the f32 rounding of the absorbed q). One
    # or two f32 ulps; asserted with ~10x margin. Scores over the latent dims only, values past
    # dv, a causal shift by one or a rolled-back NaN slot read are off by O(1) or NaN.
    t = tol(device, 1e-5)
    assert errs["o vs contract"] < t and errs["lse vs contract"] < t, errs
    assert errs["o·W_uv vs materialized MLA"] < t and errs["lse vs materialized MLA"] < t, errs


# ---------------------------------------------------------------------------------------------
# 3. torch.compile of a decode step over a cache mutated in place
# ---------------------------------------------------------------------------------------------

def decode_step(q, k_new, v_new, k_cache, v_cache, pages, slots, page_table, kv_lens, cu_q_lens):
    """One decode step as a server's captured graph holds it: write the new tokens' keys and
    values into the cache in place, then attend over the cache."""
    k_cache[pages, slots] = k_new
    v_cache[pages, slots] = v_new
    return tt.paged_attention(q, k_cache, v_cache, page_table, kv_lens, cu_q_lens, causal=True,
                              softcap=3.0, return_lse=True)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_decode_step_sees_the_cache_as_it_is(device):
    torch._dynamo.reset()   # the cpu and cuda cases compile decode_step each on its own
    g = torch.Generator().manual_seed(5)
    n_seq, L0 = 3, [5, 8, 3]
    perm = torch.randperm(POOL, generator=g)
    page_table = perm[:n_seq * 4].view(n_seq, 4).to(torch.int32)      # 4 pages each: 16 tokens
    k_cache = torch.full((POOL, PAGE, HKV, D), NAN)
    v_cache = torch.full((POOL, PAGE, HKV, DV), NAN)
    for b, n in enumerate(L0):
        for p in range(n):
            k_cache[page_table[b, p // PAGE], p % PAGE] = torch.randn(HKV, D, generator=g)
            v_cache[page_table[b, p // PAGE], p % PAGE] = torch.randn(HKV, DV, generator=g)
    k_cache, v_cache, page_table = k_cache.to(device), v_cache.to(device), page_table.to(device)
    cu = torch.arange(n_seq + 1, dtype=torch.int32, device=device)

    def inputs(lens):
        """The next token of each sequence: q, k, v, where it goes, and the lengths after it."""
        pages = torch.tensor([int(page_table[b, n // PAGE]) for b, n in enumerate(lens)])
        slots = torch.tensor([n % PAGE for n in lens])
        return tuple(t.to(device) for t in (
            torch.randn(n_seq, HQ, D, generator=g), torch.randn(n_seq, HKV, D, generator=g),
            torch.randn(n_seq, HKV, DV, generator=g), pages, slots,
            torch.tensor([n + 1 for n in lens], dtype=torch.int32)))

    graph = torch.compile(decode_step, fullgraph=True)
    calls = [0]

    def compiled(*args):
        """The compiled step; every call after the first must reuse the first call's graph (a
        recompile would hide stale constants: the point is one graph over changing contents)."""
        calls[0] += 1
        if calls[0] == 1:
            return graph(*args)
        with torch.compiler.set_stance("fail_on_recompile"):
            return graph(*args)

    lens = list(L0)
    for step in range(3):   # the second and third calls: a cache the first call's graph never saw
        q, k_new, v_new, pages, slots, kv = inputs(lens)
        k_eager, v_eager = k_cache.clone(), v_cache.clone()
        o_e, lse_e = decode_step(q, k_new, v_new, k_eager, v_eager, pages, slots, page_table, kv, cu)
        o_c, lse_c = compiled(q, k_new, v_new, k_cache, v_cache, pages, slots, page_table, kv, cu)
        # The compiled step wrote the cache in place, as eager did.
        torch.testing.assert_close(k_cache, k_eager, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(v_cache, v_eager, rtol=0, atol=0, equal_nan=True)
        # Same kernel, same inputs: the same bits (measured: identical).
        torch.testing.assert_close(o_c, o_e, rtol=0, atol=0)
        torch.testing.assert_close(lse_c, lse_e, rtol=0, atol=0)
        # And the right values: the float64 math over the keys written so far (measured: o 2.8e-7,
        # lse 2.0e-7, with |o| up to 1.4 and |lse| up to 3.1; asserted with ~10x margin).
        for b, n in enumerate(kv.tolist()):
            keys = torch.stack([k_cache[page_table[b, p // PAGE], p % PAGE] for p in range(n)])
            vals = torch.stack([v_cache[page_table[b, p // PAGE], p % PAGE] for p in range(n)])
            want_o, want_lse = attention_f64(q[b:b + 1].cpu(), keys.cpu(), vals.cpu(), softcap=3.0)
            assert max_err(o_c[b:b + 1].cpu(), want_o) < tol(device, 3e-6)
            assert max_err(lse_c[b:b + 1].cpu(), want_lse) < tol(device, 3e-6)
        lens = kv.tolist()

    # A cache changed in place outside the graph (a key of every sequence overwritten, same
    # lengths, same tensors): the compiled step reads the new contents.
    q, k_new, v_new, pages, slots, _ = inputs([n - 1 for n in lens])   # rewrite each last token
    kv = torch.tensor(lens, dtype=torch.int32, device=device)   # on the graph's device: no recompile
    o1, _ = compiled(q, k_new, v_new, k_cache, v_cache, pages, slots, page_table, kv, cu)
    for b in range(n_seq):
        k_cache[page_table[b, 0], 0] += 5.0 * torch.randn(HKV, D, generator=g).to(device)   # the first key, in place
    o2, _ = compiled(q, k_new, v_new, k_cache, v_cache, pages, slots, page_table, kv, cu)
    o2_eager, _ = decode_step(q, k_new, v_new, k_cache.clone(), v_cache.clone(), pages, slots, page_table, kv, cu)
    torch.testing.assert_close(o2, o2_eager, rtol=0, atol=0)
    assert (o2 - o1).abs().max() > 0.1           # the change reached the result (measured 0.99)
