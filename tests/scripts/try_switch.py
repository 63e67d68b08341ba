"""A loop whose step is 20 ms slower while a fix is off, for `trainprof try`'s rounds that
switch the fix off and on between steps (tryfix/switch): `zero-grad` sleeps when
zero_grad(set_to_none=False) left the gradients in place, `bf16` when the model's forward ran
without autocast. `python try_switch.py zero-grad|bf16 [STEPS [SLEEP_MS]]`."""

import sys
import time

import torch
from torch import nn

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
pause = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.02


class Sensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)  # a CNN: the bf16 fix also makes it channels-last
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if mode == "bf16" and not torch.is_autocast_enabled("cpu"):
            time.sleep(pause)
        return self.head(self.conv(x).mean((2, 3)))


torch.manual_seed(0)
model = Sensor()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 2, (2,))
for _ in range(steps):
    opt.zero_grad(set_to_none=False)
    if mode == "zero-grad" and model.head.weight.grad is not None:
        time.sleep(pause)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print(f"trained {steps} steps, loss {loss.item():.3f}")
