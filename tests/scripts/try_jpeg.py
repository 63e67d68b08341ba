"""An image-folder-like dataset: small JPEG files written into a temporary folder with PIL, then
decoded and augmented per sample, num_workers=0 (a workload for `trainprof try` and
benchmarks/fix_efficacy.py). `python try_jpeg.py [STEPS]`."""

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60


class JpegFolder(Dataset):
    def __init__(self, root: Path, length: int) -> None:
        self.files = sorted(root.glob("*/*.jpg"))
        self.length = length
        self.transform = transforms.Compose([
            transforms.RandomResizedCrop(64),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.3, 0.3, 0.3),
            transforms.ToTensor(),
            transforms.Normalize([0.5] * 3, [0.25] * 3),
        ])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        path = self.files[i % len(self.files)]
        with Image.open(path) as img:
            return self.transform(img.convert("RGB")), int(path.parent.name)


with tempfile.TemporaryDirectory(prefix="try_jpeg-") as tmp:
    root = Path(tmp)
    rng = np.random.default_rng(0)
    for k in range(64):
        (root / str(k % 4)).mkdir(exist_ok=True)
        small = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
        Image.fromarray(small).resize((96, 96), Image.BILINEAR).save(root / str(k % 4) / f"{k}.jpg")
    torch.manual_seed(0)
    loader = DataLoader(JpegFolder(root, 16 * steps), batch_size=16, shuffle=True)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(loader):  # noqa: B007 - printed after the loop
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained {step + 1} steps, loss {loss.item():.3f}")
