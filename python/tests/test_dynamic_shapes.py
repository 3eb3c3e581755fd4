"""torch.compile with dynamic shapes: the fake implementations give the outputs the inputs'
symbolic sizes (tessera.torch._symbolic_shapes), so one compiled graph serves a batch of any size
(before, each new size recompiled), with the same values and gradients as eager."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tessera.torch as tt  # noqa: E402


def compiled_counting(fn):
    """fn compiled with dynamic shapes, and a list that grows by one per graph compiled."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    return torch.compile(fn, backend=backend, dynamic=True, fullgraph=True), graphs


def run(fn, *args):
    """fn's value and the gradients of the inputs that require grad (sum of outputs · a ramp)."""
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*args)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape) if out.ndim else None)
    return out.detach(), [a.grad for a in args if a.requires_grad]


def expect_one_graph_for_every_size(step, make, sizes):
    compiled, graphs = compiled_counting(step)
    for i, n in enumerate(sizes):
        args = make(n)
        v, g = run(compiled, *args)
        rv, rg = run(step, *args)
        assert torch.equal(v, rv), n
        assert len(g) == len(rg) and all(torch.equal(a, b) for a, b in zip(g, rg)), n
        if i == 0:
            first = len(graphs)
    assert len(graphs) == first, f"recompiled for sizes {sizes}: {len(graphs)} graphs"


@pytest.mark.parametrize("reduction", ["sum", "none"], ids=["fused-op", "backward-op"])
def test_linear_cross_entropy_any_batch(reduction):
    w = torch.randn(50, 16, requires_grad=True)

    def make(B):
        g = torch.Generator().manual_seed(B)
        return torch.randn(B, 16, generator=g, requires_grad=True), w, torch.randint(0, 50, (B,), generator=g)

    expect_one_graph_for_every_size(lambda x, w, y: tt.linear_cross_entropy(x, w, y, reduction=reduction),
                                    make, [7, 9, 13])


def test_linear_cross_entropy_frozen_weight_any_batch():
    w = torch.randn(50, 16)

    def make(B):
        g = torch.Generator().manual_seed(B)
        return torch.randn(B, 16, generator=g, requires_grad=True), w, torch.randint(0, 50, (B,), generator=g)

    expect_one_graph_for_every_size(lambda x, w, y: tt.linear_cross_entropy(x, w, y), make, [6, 11])


def test_attention_any_sequence_length():
    def make(S):
        g = torch.Generator().manual_seed(S)
        return [torch.randn(1, S, 2, 8, generator=g, requires_grad=True) for _ in range(3)]

    expect_one_graph_for_every_size(lambda q, k, v: tt.attention(q, k, v, causal=True), make, [5, 12, 17])


def test_grouped_matmul_any_row_count():
    rhs = torch.randn(3, 6, 4, requires_grad=True)

    def make(M):
        g = torch.Generator().manual_seed(M)
        sizes = torch.tensor([M // 3, M // 3, M - 2 * (M // 3)], dtype=torch.int32)
        return torch.randn(M, 6, generator=g, requires_grad=True), rhs, sizes

    expect_one_graph_for_every_size(lambda l, r, s: tt.grouped_matmul(l, r, s), make, [9, 14, 20])


def test_equal_sizes_share_a_symbol_and_a_later_difference_recompiles():
    """Duck sizing: B == H at the first trace gives them one symbol; a call where they differ is
    then a new graph, never a wrong shape."""
    compiled, graphs = compiled_counting(lambda x, w, y: tt.linear_cross_entropy(x, w, y, reduction="none"))
    counts = []
    for B, H in ((8, 8), (10, 10), (10, 6)):
        x, w, y = torch.randn(B, H), torch.randn(30, H), torch.randint(0, 30, (B,))
        assert torch.equal(compiled(x, w, y), tt.linear_cross_entropy(x, w, y, reduction="none"))
        counts.append(len(graphs))
    assert counts[1] == counts[0] and counts[2] > counts[1], counts


def test_flattened_language_model_inputs_any_batch_and_length():
    """The usual loss: hidden[:, :-1] and labels[:, 1:] flattened inside the compiled step. x's row
    count is an expression (B·T − B); the loss and lse follow it: one graph for every (B, T)."""
    w = torch.randn(40, 8, requires_grad=True)

    def step(h, w, y):
        H = h.shape[-1]
        return tt.linear_cross_entropy(h[:, :-1].reshape(-1, H).contiguous(), w, y[:, 1:].reshape(-1).contiguous(),
                                       reduction="none")

    def make(bt):
        B, T = bt
        g = torch.Generator().manual_seed(B * 100 + T)
        return torch.randn(B, T, 8, generator=g, requires_grad=True), w, torch.randint(0, 40, (B, T), generator=g)

    expect_one_graph_for_every_size(step, make, [(2, 5), (2, 7), (3, 9)])


def test_two_sizes_varying_independently_and_a_transposed_weight():
    """B and V both vary; w in the hv layout (dw's fake is a transposed layout too)."""
    def make(bv):
        B, V = bv
        g = torch.Generator().manual_seed(B + V)
        return (torch.randn(B, 8, generator=g, requires_grad=True),
                torch.randn(V, 8, generator=g).t().contiguous().requires_grad_(),
                torch.randint(0, V, (B,), generator=g))

    expect_one_graph_for_every_size(lambda x, w, y: tt.linear_cross_entropy(x, w, y, w_layout="hv"), make,
                                    [(7, 30), (9, 45), (13, 38)])


def test_paged_attention_any_batch_of_sequences():
    """page_table and kv_lens are [N], cu_q_lens [N + 1]: two symbols the spec keeps one apart, moved
    together by the probes; o follows the token count."""
    import test_paged_attention as pa

    def make(n):
        q_lens, kv_lens = (1, 4, 0, 3, 2, 1, 2)[:n], (9, 6, 2, 11, 5, 7, 3)[:n]
        return [torch.from_numpy(a) for a in pa.problem(seed=n, q_lens=q_lens, kv_lens=kv_lens)]

    compiled, graphs = compiled_counting(lambda *a: tt.paged_attention(*a, causal=True))
    counts = []
    for n in (4, 6, 7):
        args = make(n)
        assert torch.equal(compiled(*args), tt.paged_attention(*args, causal=True)), n
        counts.append(len(graphs))
    assert counts[1] == counts[2], counts  # (the first change may still specialize a size: a page-table width)


def test_inductor_backend():
    w = torch.randn(30, 8, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(lambda x, w, y: tt.linear_cross_entropy(x, w, y), dynamic=True, fullgraph=True)
    for B in (6, 10):
        x, y = torch.randn(B, 8, requires_grad=True), torch.randint(0, 30, (B,))
        v, g = run(f, x, w, y)
        rv, rg = run(lambda x, w, y: tt.linear_cross_entropy(x, w, y), x, w, y)
        assert torch.equal(v, rv) and all(torch.equal(a, b) for a, b in zip(g, rg))


def test_unbacked_row_counts():
    """Sizes marked unbacked (data-dependent: MoE routing, masks) have no hint: the probes start from
    a stand-in, x's and the labels' rows (two symbols) are declared equal, and the outputs follow."""
    w = torch.randn(30, 8)
    torch._dynamo.reset()
    f = torch.compile(lambda x, w, y: tt.linear_cross_entropy(x, w, y, reduction="none"), backend="aot_eager",
                      fullgraph=True)
    for B in (5, 9):
        x, y = torch.randn(B, 8), torch.randint(0, 30, (B,))
        torch._dynamo.decorators.mark_unbacked(x, 0)
        torch._dynamo.decorators.mark_unbacked(y, 0)
        assert torch.equal(f(x, w, y), tt.linear_cross_entropy(x, w, y, reduction="none")), B


def test_unbacked_sizes_with_strided_views():
    """A strided view (x[:, :H], q, k, v split off one projection) or linear_cross_entropy's
    transposed w, with a size marked unbacked: the front end cannot ask whether it is contiguous
    without guarding on a data-dependent size, so it copies (a transposed w with an unbacked V
    failed with GuardOnDataDependentSymNode once the front end copied strided views: a review's
    finding)."""
    torch._dynamo.reset()
    lce = torch.compile(lambda x, w, y: tt.linear_cross_entropy(x, w, y, reduction="none"), backend="aot_eager",
                        fullgraph=True)
    x, y = torch.randn(6, 8), torch.randint(0, 20, (6,))
    w = torch.randn(8, 25).t()                      # [V=25, H=8], a transposed view
    torch._dynamo.decorators.mark_unbacked(w, 0)
    assert torch.equal(lce(x, w, y), tt.linear_cross_entropy(x, w, y, reduction="none"))
    wide = torch.randn(7, 12)
    torch._dynamo.decorators.mark_unbacked(wide, 0)
    got = lce(wide[:, :8], torch.randn(20, 8), torch.randint(0, 20, (7,)))
    assert got.shape == (7,)

    attn = torch.compile(lambda qkv: tt.attention(*qkv.split([4, 2, 2], dim=2), causal=True), backend="aot_eager",
                         fullgraph=True)
    qkv = torch.randn(1, 9, 8, 8)                   # [B, S, Hq + 2·Hkv, D]
    torch._dynamo.decorators.mark_unbacked(qkv, 1)
    assert torch.equal(attn(qkv), tt.attention(*qkv.split([4, 2, 2], dim=2), causal=True))
