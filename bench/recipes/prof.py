#!/usr/bin/python3
"""Scratch: op-level profile of one train step config."""
import sys, torch, torch.nn as nn
sys.path.insert(0, '.')
from rtrain import build
torch.set_num_threads(2)
spec, fc, bs, cl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mf = torch.channels_last if cl else torch.contiguous_format
m = build(spec, 1, 'relu', fc, 0.0, 'flat').to(memory_format=mf)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
x = torch.randn(bs, 1, 28, 28).contiguous(memory_format=mf); y = torch.randint(0, 10, (bs,))
lf = nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True); l = lf(m(x), y); l.backward(); opt.step()
for _ in range(5): step()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as p:
    for _ in range(20): step()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
