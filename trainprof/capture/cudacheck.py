"""Whether CUDA is available, asked before the script runs without changing what its forks do.

`torch.cuda.is_available()` asks the CUDA runtime for the device count, and that registers
torch's fork handler even where there is no GPU: every process forked afterwards (the script's
DataLoader workers) is then a "bad fork" to torch. Such a worker cannot initialise CUDA, and
`torch.manual_seed` there skips seeding CUDA: torchvision's FakeData seeds for every sample, and
on a CUDA build whose parent never initialised CUDA a worker that is not a bad fork formats its
stack for that seed (torch.cuda's lazy call), about 7 ms per 64-sample batch at a real worker's
depth on this project's CPU machine. Under `trainprof run` the script's workers, and the
worker that times fetches for dataloader-starvation, then did less than under python.

So the check answers without the runtime where it can: CUDA already initialised (the fork
handler is there anyway), no CUDA in this torch, no GPU driver's device node on Linux (a CPU
machine), else NVML, torch's own check that leaves forks alone
(`PYTORCH_NVML_BASED_CUDA_CHECK=1`; torch falls back to the runtime where NVML fails).
"""

from __future__ import annotations

import os
import sys

import torch

from trainprof.capture.environ import env_set

# Device nodes one of which a CUDA or ROCm driver creates: NVIDIA's (/dev/nvidiactl; WSL2's
# /dev/dxg; Jetson's /dev/nvmap), AMD's /dev/kfd.
DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg", "/dev/nvmap",
                "/dev/kfd")  # fmt: skip
NVML_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def cuda_available() -> bool:
    """torch.cuda.is_available(), without marking the processes forked later as bad forks where
    the answer can be had otherwise (see the module doc)."""
    if torch.cuda.is_initialized():
        return torch.cuda.is_available()
    if not torch.backends.cuda.is_built():
        return False
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in DRIVER_NODES):
        return False
    with env_set({NVML_ENV: "1"}):
        return torch.cuda.is_available()
