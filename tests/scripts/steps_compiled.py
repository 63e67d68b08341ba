"""A torch.compile'd train step (eager backend: no C++ compiler needed) that calls a module and
reads a scalar. Writes what dynamo compiled (graphs, ops in them, graph-break reasons, resume
functions) to the JSON file argv[1]: under trainprof it must be what plain python gives."""

import json
import sys

import torch
from torch import nn

torch._dynamo.reset()
torch._dynamo.utils.counters.clear()
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


@torch.compile(backend="eager")
def train_step(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    loss = model(x).pow(2).mean()
    return loss, loss.item()


for _ in range(6):
    loss, value = train_step(torch.randn(8, 4))
    loss.backward()
    opt.step()
    opt.zero_grad()
counters = torch._dynamo.utils.counters
with open(sys.argv[1], "w") as f:
    json.dump(
        {
            "graphs": counters["stats"]["unique_graphs"],
            "ops_in_graphs": counters["stats"]["calls_captured"],
            "break_reasons": sorted(r.splitlines()[0] for r in counters["graph_break"]),
            "resumes": counters["resumes"],
        },
        f,
    )
