"""share.py FILE...: the held threads' share of their CPU, from the lines a farmem build with
results/gather/share/print.patch prints at each check while it holds a process's faulting
threads ("share WAITING_PCT RUNNING_PCT HELD": the held threads' schedstat time waiting for their
CPU and on it, over the window since the last check, in % of the window). Per file: the checks,
the median and 90th percentile of each, their means, and the most each reached as the moving
average runtime/gather.go keeps (busyChecks = 8 checks; the first three checks not counted)."""
import sys

for path in sys.argv[1:]:
    rows = [l.split() for l in open(path) if l.startswith("share ")]
    out = [path, "checks %d" % len(rows)]
    for col, name in ((2, "on the CPU"), (1, "waiting")):
        seq = [int(r[col]) / 100 for r in rows]
        v = sorted(seq)
        n = len(v)
        e, top = 0.0, 0.0
        for i, x in enumerate(seq):
            e += (x - e) / 8
            if i >= 3:
                top = max(top, e)
        out.append("%s: median %.2f, p90 %.2f, mean %.2f, moving average at most %.2f" % (name, v[n // 2], v[n * 9 // 10], sum(v) / n, top))
    print("; ".join(out))
