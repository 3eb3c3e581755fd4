"""What test_training.py (PyTorch) and test_training_jax.py share: the small model's sizes and
options, its Tessera ops from one front end (tessera.torch or tessera.jax), and the same five ops
from a framework's own math (the oracle)."""

V, H, B, S = 96, 32, 2, 12          # vocabulary, hidden, batch, sequence
HQ, HKV, D = 4, 2, 8                 # attention heads (GQA 2:1), head dim
E, FF = 4, 24                        # experts, expert hidden
NH, DH = 2, 8                        # xLSTM heads, head dim
WINDOW, SOFTCAP = 6, 20.0
SMOOTH, ZLOSS = 0.1, 1e-3
IGNORE = -100


def tessera_ops(m):
    """The model's five ops on front end `m` (the same options as the references take)."""
    class TesseraOps:
        attention = staticmethod(lambda q, k, v: m.attention(q, k, v, causal=True, window_left=WINDOW,
                                                             softcap=SOFTCAP))
        gmm = staticmethod(lambda lhs, rhs, gs, transpose_rhs=False: m.grouped_matmul(lhs, rhs, gs,
                                                                                     transpose_rhs=transpose_rhs))
        mlstm = staticmethod(lambda q, k, v, i, f: m.mlstm(q, k, v, i, f))
        slstm = staticmethod(lambda wx, r, b: m.slstm(wx, r, b))
        lce = staticmethod(lambda x, w, y: m.linear_cross_entropy(x, w, y, label_smoothing=SMOOTH,
                                                                   z_loss_weight=ZLOSS, ignore_index=IGNORE))
    return TesseraOps


def reference_ops(attention_ref, gmm_ref, mlstm_ref, slstm_ref, lce_ref):
    """The model's five ops in a framework's own math, with the options tessera_ops passes."""
    class ReferenceOps:
        attention = staticmethod(lambda q, k, v: attention_ref(q, k, v, True, WINDOW, SOFTCAP))
        gmm = staticmethod(gmm_ref)
        mlstm = staticmethod(mlstm_ref)
        slstm = staticmethod(slstm_ref)
        lce = staticmethod(lce_ref)
    return ReferenceOps
