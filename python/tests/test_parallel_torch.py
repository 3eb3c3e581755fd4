"""tessera.parallel.torch on torch.distributed (gloo, CPU): 2 and 4 processes on localhost, each
result and gradient against the single-process computation of the same global problem, with
ragged shards (experts and sequence positions not divisible by the ranks, a rank with no experts,
an expert with no tokens, a rank with no positions), and a bad input on one rank making every
rank raise. Every collective is bounded: the process group's timeout and the join deadline."""
import datetime
import os
import socket
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

DEADLINE_S = 120
EXPERT_SPLITS = {2: [3, 2], 4: [2, 1, 0, 2]}        # E = 5 experts; rank 2 of 4 holds none
SEQ_SPLITS = {2: [6, 7], 4: [4, 0, 5, 4]}           # S = 13 positions; rank 1 of 4 holds none
E, K, N = 5, 6, 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tokens(rank):
    """Rank r's tokens: 5 + 3r of them, expert 4 never chosen (an expert with no tokens)."""
    g = np.random.default_rng(100 + rank)
    t = 5 + 3 * rank
    return g.standard_normal((t, K)).astype(np.float32), g.integers(0, 4, t).astype(np.int64), \
        g.standard_normal((t, N)).astype(np.float32)


def _check_expert_parallel(rank, world):
    import tessera.parallel.torch as tpt
    w_all = np.random.default_rng(7).standard_normal((E, K, N)).astype(np.float32)
    sizes = EXPERT_SPLITS[world]
    start = sum(sizes[:rank])
    x, ids, dout = _tokens(rank)
    X = torch.from_numpy(x).requires_grad_()
    W = torch.from_numpy(w_all[start:start + sizes[rank]].copy()).requires_grad_()
    out = tpt.expert_parallel_grouped_matmul(X, torch.from_numpy(ids), W, num_experts=E, expert_start=start)
    (out * torch.from_numpy(dout)).sum().backward()
    want = np.einsum("tk,tkn->tn", x.astype(np.float64), w_all[ids].astype(np.float64))
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    dx = np.einsum("tn,tkn->tk", dout.astype(np.float64), w_all[ids].astype(np.float64))
    np.testing.assert_allclose(X.grad.numpy(), dx, rtol=1e-5, atol=1e-5)
    dw = np.zeros((E, K, N))
    for r in range(world):  # dW of an expert sums over every rank's tokens routed to it
        xr, ir, dr = _tokens(r)
        np.add.at(dw, ir, np.einsum("tk,tn->tkn", xr.astype(np.float64), dr.astype(np.float64)))
    np.testing.assert_allclose(W.grad.numpy(), dw[start:start + sizes[rank]], rtol=1e-5, atol=1e-5)


def _full_attention(causal, window_left, seed=3):
    import tessera.torch as tt
    g = torch.Generator().manual_seed(seed)
    S = 13
    q, k, v = (torch.randn(2, S, h, 8, generator=g) for h in (4, 2, 2))
    do = torch.randn(2, S, 4, 8, generator=g)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = tt.attention(q, k, v, causal=causal, window_left=window_left)
    (o * do).sum().backward()
    return q, k, v, do, o


def _check_context_parallel(rank, world, causal, window_left):
    import tessera.parallel.torch as tpt
    q, k, v, do, o = _full_attention(causal, window_left)
    lens = SEQ_SPLITS[world]
    a = sum(lens[:rank])
    sl = slice(a, a + lens[rank])
    ql, kl, vl = (t.detach()[:, sl].clone().requires_grad_() for t in (q, k, v))
    ol = tpt.context_parallel_attention(ql, kl, vl, causal=causal, window_left=window_left)
    (ol * do[:, sl]).sum().backward()
    torch.testing.assert_close(ol, o.detach()[:, sl], rtol=2e-5, atol=2e-5)
    for got, full in ((ql, q), (kl, k), (vl, v)):
        torch.testing.assert_close(got.grad, full.grad[:, sl], rtol=2e-5, atol=2e-5)


def _check_errors_reach_every_rank(rank, world):
    import tessera.parallel.torch as tpt
    x, ids, _ = _tokens(rank)
    if rank == 1:
        ids[0] = E + 2  # a bad expert id on one rank only
    sizes = EXPERT_SPLITS[world]
    w = torch.zeros(sizes[rank], K, N)
    with pytest.raises(ValueError, match=r"rank 1: expert_ids must lie in \[0, num_experts=5\)"):
        tpt.expert_parallel_grouped_matmul(torch.from_numpy(x), torch.from_numpy(ids), w, num_experts=E,
                                           expert_start=sum(sizes[:rank]))
    with pytest.raises(ValueError, match="rank 0: experts must be split in rank order"):
        tpt.expert_parallel_grouped_matmul(torch.from_numpy(x), torch.from_numpy(ids % E), w, num_experts=E,
                                           expert_start=0 if rank == 0 else 1)  # overlapping ranges
    q = torch.zeros(1, 3, 2, 4)
    with pytest.raises(ValueError, match="rank 0: context_parallel_attention: a window needs causal"):
        tpt.context_parallel_attention(q, q, q, window_left=2)


def _worker(rank, world, port, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        _check_expert_parallel(rank, world)
        for causal, window in ((False, -1), (True, -1), (True, 3)):
            _check_context_parallel(rank, world, causal, window)
        _check_errors_reach_every_rank(rank, world)
    except BaseException:
        failures.put(f"rank {rank}/{world}:\n{traceback.format_exc()}")
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_parallel_torch_matches_one_process(world):
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    procs = mp.start_processes(_worker, args=(world, _free_port(), failures), nprocs=world, join=False,
                               start_method="spawn")
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=DEADLINE_S)
    while not procs.join(timeout=1):
        if datetime.datetime.now() > deadline:
            for p in procs.processes:
                p.kill()
            pytest.fail(f"{world} ranks did not finish within {DEADLINE_S} s (a collective hung)")
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, "\n".join(errors)
