#!/usr/bin/python3
"""Scratch: train-step cost per 60k-sample epoch for candidate models, robust-ish to contention:
interleaved rounds, min wall at 2 threads, plus CPU time at 1 thread (compute proxy)."""
import sys, time, torch, torch.nn as nn
sys.path.insert(0, '.')
from rtrain import build
import os
rounds = int(os.environ.get("ROUNDS", 3))
cfgs = []
for a in sys.argv[1:]:
    c = a.split(';')
    cfgs.append(dict(spec=c[0], bn=int(c[1]), fc=int(c[2]), bs=int(c[3]), mk=int(c[4]), cl=int(c[5]),
                     head=c[6] if len(c) > 6 else 'flat'))
def setup(c):
    torch.backends.mkldnn.enabled = bool(c['mk'])
    torch.manual_seed(0)
    mf = torch.channels_last if c['cl'] else torch.contiguous_format
    m = build(c['spec'], c['bn'], 'relu', c['fc'], 0.0, c['head']).to(memory_format=mf)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(c['bs'], 1, 28, 28).contiguous(memory_format=mf); y = torch.randint(0, 10, (c['bs'],))
    lf = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad(set_to_none=True); l = lf(m(x), y); l.backward(); opt.step()
    return step
res = {i: dict(w2=1e9, c1=1e9) for i in range(len(cfgs))}
for r in range(rounds):
    for i, c in enumerate(cfgs):
        step = setup(c)
        n = max(8, int(os.environ.get('NS', 3000)) // c['bs'])
        torch.set_num_threads(int(os.environ.get('THREADS', 2)))
        for _ in range(3): step()
        t = time.perf_counter()
        for _ in range(n): step()
        res[i]['w2'] = min(res[i]['w2'], (time.perf_counter() - t) / n * 60000 / c['bs'])
        if os.environ.get('SKIP1'): continue
        torch.set_num_threads(1)
        for _ in range(2): step()
        t = time.process_time()
        for _ in range(n): step()
        res[i]['c1'] = min(res[i]['c1'], (time.process_time() - t) / n * 60000 / c['bs'])
for i, c in enumerate(cfgs):
    print(f"{c['spec']:16s} bn={c['bn']} fc={c['fc']:3d} {c['head']} bs={c['bs']:4d} mkldnn={c['mk']} cl={c['cl']}: "
          f"wall2thr {res[i]['w2']:6.2f} s/epoch   cpu1thr {res[i]['c1']:6.2f} s/epoch", flush=True)
