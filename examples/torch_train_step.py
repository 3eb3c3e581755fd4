"""A tiny language-model head trained with Tessera's fused linear cross-entropy (PyTorch).

The model never materializes the tokens x vocabulary logits in the loss: lm_head.weight goes
straight into tessera.torch.linear_cross_entropy. Run: python examples/torch_train_step.py
"""
import torch

import tessera.torch as tt

torch.manual_seed(0)
V, H, B, T = 1024, 128, 8, 64          # vocabulary, hidden, batch, sequence
device = "cuda" if torch.cuda.is_available() else "cpu"


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(H, 4 * H), torch.nn.GELU(), torch.nn.Linear(4 * H, H))
        self.norm = torch.nn.LayerNorm(H)
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def forward(self, tokens):             # hidden states [B, T, H]; the logits are never formed
        h = self.embed(tokens)
        return self.norm(h + self.mlp(h))


model = TinyLM().to(device)
loss_fn = tt.LinearCrossEntropyLoss(reduction="mean", lse_square_scale=1e-4)  # Liger's signature
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)


@torch.compile(fullgraph=True)            # the custom op (and its backward) stay in the graph
def compute_loss(tokens, labels):
    return loss_fn(model.lm_head.weight, model(tokens), labels)


for step in range(30):
    tokens = torch.randint(0, V, (B, T), device=device)
    labels = (tokens * 7 + 3) % V         # a rule the model can learn: next = 7 * token + 3
    opt.zero_grad(set_to_none=True)
    loss = compute_loss(tokens, labels)
    loss.backward()
    opt.step()
    if step % 5 == 0 or step == 29:
        print(f"step {step:2d}  loss {loss.item():.4f}")
