"""memory_budget (ExecOptions::memory_budget) from every front end: validated in Python, and it
reaches the kernel. The evidence that it arrives: linear_cross_entropy's cpu backend with a 16-bit
dw computes the gradients in vocabulary slices when the f32 dw accumulator does not fit the budget,
and with a budget too small even for its fixed part it says so on stderr, naming the budget's
bytes. Each test uses its own byte count: the warning is printed once per message and process."""
import numpy as np
import pytest

import tessera

B, H, V = 12, 16, 200  # V over the 64-column slice width: the too-small budget warns


def problem(seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((B, H)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 0.3).astype(np.float32)
    y = rng.integers(0, V, B).astype(np.int64)
    return x, w, y


def warned(capfd, budget: int) -> bool:
    err = capfd.readouterr().err
    return f"memory_budget ({budget} bytes" in err and "slices of 64 columns" in err


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (2 ** 63, ValueError), (True, TypeError),
                                        (1.5, TypeError), ("1MiB", TypeError)])
def test_bad_budgets_are_refused_before_the_call(bad, error):
    x, w, y = problem()
    with pytest.raises(error, match="memory_budget"):
        tessera.linear_cross_entropy(x, w, y, memory_budget=bad)
    with pytest.raises(error, match="memory_budget"):
        tessera.call("linear_cross_entropy", "forward", {"x": x, "w": w, "labels": y}, memory_budget=bad)


def test_numpy_budget_keeps_the_values():
    x, w, y = problem()
    want = tessera.linear_cross_entropy(x, w, y, implementation="cpu")
    for budget in (None, 0, 1 << 20, np.int64(4096)):
        got = tessera.linear_cross_entropy(x, w, y, implementation="cpu", memory_budget=budget)
        np.testing.assert_array_equal(got, want)
    assert "memory_budget=None" in tessera.linear_cross_entropy.__doc__


def test_numpy_budget_reaches_the_kernel(capfd):
    x, w, y = problem(4)  # f16: NumPy has no bf16 dtype; a 16-bit dw takes the slices all the same
    t = {"x": x.astype(np.float16), "w": w.astype(np.float16), "labels": y, "grad_loss": np.float32(1.0)}
    capfd.readouterr()
    free = tessera.call("linear_cross_entropy", "backward", t, implementation="cpu")
    assert not warned(capfd, 107)
    tight = tessera.call("linear_cross_entropy", "backward", t, implementation="cpu", memory_budget=107)
    assert warned(capfd, 107)
    for name in ("dx", "dw"):
        np.testing.assert_allclose(tight[name].astype(np.float32), free[name].astype(np.float32), rtol=2e-3, atol=1e-4)


def test_torch_budget_reaches_the_kernel(capfd):
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    x, w, y = problem(2)

    def grads(**kw):
        xt = torch.from_numpy(x).bfloat16().requires_grad_()
        wt = torch.from_numpy(w).bfloat16().requires_grad_()
        tt.linear_cross_entropy(xt, wt, torch.from_numpy(y), implementation="cpu", **kw).sum().backward()
        return xt.grad.float(), wt.grad.float()

    capfd.readouterr()
    free = grads()
    tight = grads(memory_budget=102)
    assert warned(capfd, 102)
    for a, b in zip(tight, free):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)
    with pytest.raises(ValueError, match="memory_budget"):
        grads(memory_budget=-5)
    grads(memory_budget=105, reduction="none")  # a loss per token: the forward op, then the backward op
    assert warned(capfd, 105)
    loss = tt.LinearCrossEntropyLoss(memory_budget=103)
    xt = torch.from_numpy(x).bfloat16().requires_grad_()
    wt = torch.from_numpy(w).bfloat16().requires_grad_()
    loss(wt, xt, torch.from_numpy(y)).backward()
    assert warned(capfd, 103)


def test_jax_budget_reaches_the_kernel(capfd):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    x, w, y = problem(3)
    xj, wj, yj = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), jnp.asarray(y)

    def grads(**kw):
        f = lambda a, b: tj.linear_cross_entropy(a, b, yj, implementation="cpu", **kw).astype(jnp.float32)
        return jax.grad(f, argnums=(0, 1))(xj, wj)

    capfd.readouterr()
    free = grads()
    tight = jax.jit(lambda: grads(memory_budget=104))()
    assert warned(capfd, 104)
    for a, b in zip(tight, free):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=1e-3)
    jax.grad(lambda a, b: tj.linear_cross_entropy(a, b, yj, implementation="cpu", reduction="none",
                                                   memory_budget=108).astype(jnp.float32).sum(), argnums=(0, 1))(xj, wj)
    assert warned(capfd, 108)  # per-token losses: the forward, then the backward through the FFI
    # w frozen: dw is skipped, so no f32 dw accumulator and nothing over budget.
    jax.grad(lambda a: tj.linear_cross_entropy(a, wj, yj, implementation="cpu", reduction="none", frozen="w",
                                                memory_budget=110).astype(jnp.float32).sum())(xj)
    assert not warned(capfd, 110)
    t = {"x": xj, "w": wj, "labels": yj, "grad_loss": jnp.ones((), jnp.float32)}
    tj.call("linear_cross_entropy", "backward", t, implementation="cpu", memory_budget=109)["dw"].block_until_ready()
    assert warned(capfd, 109)
    with pytest.raises(TypeError, match="memory_budget"):
        tj.linear_cross_entropy(xj, wj, yj, memory_budget=2.0)
