"""linear_cross_entropy's partial form from Python in one process: tessera.call on two slices of
the classifier, combined as tessera.parallel does, equals the unsplit loss; the generated
functions refuse vocab_total (their outputs would not be the loss)."""
import numpy as np
import pytest

import tessera

IGNORE = -(2 ** 31) + 1


def test_two_slices_combine_to_the_unsplit_loss():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 7)).astype(np.float32)
    w = rng.standard_normal((9, 7)).astype(np.float32)
    labels = np.array([0, 8, 4, 3, 7, 1], np.int64)
    want = tessera.linear_cross_entropy(x, w, labels, reduction="none")
    stats = []
    for a, b in ((0, 4), (4, 9)):
        out = tessera.call("linear_cross_entropy", "forward", {"x": x, "w": w[a:b], "labels": labels - a},
                           vocab_total=9, ignore_index=IGNORE)
        stats.append(out)
    lse = np.logaddexp(stats[0]["lse"].astype(np.float64), stats[1]["lse"])
    zy = stats[0]["label_logit"].astype(np.float64) + stats[1]["label_logit"]
    np.testing.assert_allclose(lse - zy, want, rtol=1e-5, atol=1e-6)


def test_generated_functions_refuse_the_partial_form():
    x, w, labels = np.ones((3, 4), np.float32), np.ones((5, 4), np.float32), np.array([0, 1, 2])
    with pytest.raises(ValueError, match="partial form"):
        tessera.linear_cross_entropy(x, w, labels, vocab_total=9, ignore_index=IGNORE)
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    with pytest.raises(ValueError, match="vocab_start= and process_group="):
        tt.linear_cross_entropy(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(labels), vocab_total=9)
