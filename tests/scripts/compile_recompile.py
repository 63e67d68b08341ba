"""A torch.compile'd model (eager backend: dynamo only, fast) whose batch shrinks at step 20,
outside trainprof's default window (wait 5, warm-up 2, active 3): one recompile there.

Usage: compile_recompile.py [STEPS] [--graph-break]
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 30


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if "--graph-break" in sys.argv:
            torch._dynamo.graph_break()  # BREAK_LINE
        return self.b(h)


model = torch.compile(Net(), backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    batch = 16 if step < 20 else 12  # the shape change: a guard on x.size(0) fails
    x, y = torch.randn(batch, 16), torch.randn(batch, 1)
    opt.zero_grad()
    out = model(x)  # COMPILED_CALL
    loss = nn.functional.mse_loss(out, y)
    loss.backward()
    opt.step()  # OPT_STEP
print("done")
