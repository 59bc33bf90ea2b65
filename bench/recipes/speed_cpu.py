#!/usr/bin/python3
"""Scratch: 1-thread process CPU seconds per 60k-sample epoch (train step) and per 10k eval;
interleaved rounds, min and median. Contention-robust-ish proxy for relative compute cost."""
import sys, os, time, statistics, torch, torch.nn as nn
sys.path.insert(0, '.')
from rtrain import build
torch.set_num_threads(1)
rounds = int(os.environ.get("ROUNDS", 5))
cfgs = []
for a in sys.argv[1:]:
    c = a.split(';')
    cfgs.append(dict(spec=c[0], bn=int(c[1]), fc=int(c[2]), bs=int(c[3]), mk=int(c[4]), cl=int(c[5])))
built = []
for c in cfgs:
    torch.manual_seed(0)
    mf = torch.channels_last if c['cl'] else torch.contiguous_format
    m = build(c['spec'], c['bn'], 'relu', c['fc'], 0.0, 'flat').to(memory_format=mf)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(c['bs'], 1, 28, 28).contiguous(memory_format=mf); y = torch.randint(0, 10, (c['bs'],))
    xe = torch.randn(1000, 1, 28, 28).contiguous(memory_format=mf)
    built.append((m, opt, x, y, xe))
lf = nn.CrossEntropyLoss()
tr = [[] for _ in cfgs]; ev = [[] for _ in cfgs]
for r in range(rounds):
    for i, c in enumerate(cfgs):
        torch.backends.mkldnn.enabled = bool(c['mk'])
        m, opt, x, y, xe = built[i]
        def step():
            opt.zero_grad(set_to_none=True); l = lf(m(x), y); l.backward(); opt.step()
        step(); n = max(6, 2000 // c['bs'])
        t = time.process_time()
        for _ in range(n): step()
        tr[i].append((time.process_time() - t) / n * 60000 / c['bs'])
        m.eval()
        with torch.no_grad():
            m(xe); t = time.process_time(); m(xe); m(xe); ev[i].append((time.process_time() - t) / 2 * 10)
        m.train()
for i, c in enumerate(cfgs):
    print(f"{c['spec']:8s} fc={c['fc']} bn={c['bn']} bs={c['bs']:4d} mkldnn={c['mk']} cl={c['cl']}: train cpu1 "
          f"min {min(tr[i]):6.2f} med {statistics.median(tr[i]):6.2f} s/epoch | eval10k min {min(ev[i]):5.2f} s", flush=True)
