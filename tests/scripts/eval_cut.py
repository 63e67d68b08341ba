"""Training over a DataLoader to its end each epoch, with two evaluations cut short every 4
steps: a map-style loader left after 2 of its 5 batches (the loop breaks out and drops the
iterator), and an iterable one left after 1 batch (its iterator kept by the script until the
next pass). trainprof.json records where each loader's iterators started and how many batches
each cut one had left (analysis/loader_cuts). A third, iterable, is dropped after one batch each
pass: trainprof must not keep it alive (its generator closes its source when freed). A fourth is
built anew for every pass (one entry in trainprof.json) and left after 1 of its 5 batches."""

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

torch.manual_seed(0)


class Stream(IterableDataset):
    def __iter__(self):
        for _ in range(100):
            yield torch.randn(8)


CLOSED = []


class Closing(IterableDataset):
    def __iter__(self):
        try:
            while True:
                yield torch.randn(8)
        finally:
            CLOSED.append(1)


model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = DataLoader(TensorDataset(torch.randn(128, 8)), batch_size=16)  # TRAIN (8 batches)
val = DataLoader(TensorDataset(torch.randn(80, 8)), batch_size=16)  # VAL (5 batches)
stream = DataLoader(Stream(), batch_size=4)  # STREAM
closing = DataLoader(Closing(), batch_size=4)
held_out = TensorDataset(torch.randn(80, 8))

for _epoch in range(3):
    for i, (x,) in enumerate(train):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if i % 4 == 3:
            with torch.no_grad():
                for j, (v,) in enumerate(val):
                    model(v)
                    if j == 1:
                        break
                streamed = iter(stream)  # kept: an iterable's iterator is not held for it
                model(next(streamed))
                model(next(iter(closing)))
                for (v,) in DataLoader(held_out, batch_size=16):  # REBUILT
                    model(v)
                    break
print("closed", len(CLOSED))
