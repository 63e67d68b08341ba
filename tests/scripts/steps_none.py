"""Tensor math without any training step."""

import torch

print(float((torch.randn(8, 8) @ torch.randn(8, 8)).sum()) != 0.0)
