"""A small model compiled by the engine: one graph break (a print), one recompile (a new
batch size), a training step. Run it with TORCH_TRACE set and open the tlparse report,
or with TORCH_LOGS=graph_breaks,recompiles,guards to read the same story as logs."""

import engine  # import before torch: engine reads TORCH_LOGS / TORCH_TRACE first

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return x + h


@engine.compile(backend="eager")
def score(x, w):
    y = torch.sin(x) @ w
    print("halfway, shape", tuple(y.shape))  # a graph break: compiled before, eager here, resumed after
    return y.relu().sum(dim=-1)


def main():
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    print("score:", score(x, w))
    print("score, new batch size:", score(torch.randn(6, 8), w))  # recompiles

    model = engine.compile(Block())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
