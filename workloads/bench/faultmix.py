#!/usr/bin/env python3
"""faultmix.py TRACE [GCLOG]: what a recorded fault trace says about a program's paging.

TRACE is `farmem run --record-faults TRACE` (binary FMTRACE1; record with --prefetch none so
that every miss is in it). GCLOG, optional, is a JVM's `-Xlog:gc:file=GCLOG:uptimenanos`: the
backend faults are then split into those inside a collection pause, inside a concurrent mark
cycle (outside pauses) and the rest. The JVM's clock starts a few milliseconds after farmem's,
so the split is good to that much.

It prints:
  - the faults by source (0 zero-fill, 1 backend, 3 write-protect);
  - how many backend faults land 1 to 4 pages after a page that faulted within the last W
    backend faults (W = 16, 64, 256): the share a prefetcher that follows several sequential
    walks at once could have installed ahead, at most;
  - the distinct pages and the distance, in backend faults, between two faults on one page
    (quantiles): against the resident set in pages, how random the reuse is.
"""
import bisect
import collections
import re
import struct
import sys


def read_trace(path):
    data = open(path, 'rb').read()
    if data[:8] != b'FMTRACE1':
        sys.exit(f'{path}: not a binary fault trace (FMTRACE1)')
    n = (len(data) - 8) // 24
    for i in range(n):
        t, _pid, _kind, src, _res, addr = struct.unpack_from('<qIBBHQ', data, 8 + 24 * i)
        yield t, src, addr >> 12


def read_gclog(path):
    pauses, marks = [], []
    for line in open(path):
        m = re.match(r'\[(\d+)ns\] GC\(\d+\) Pause .* ([0-9.]+)ms$', line.strip())
        if m:
            end = int(m.group(1))
            pauses.append((end - float(m.group(2)) * 1e6, end))
            continue
        m = re.match(r'\[(\d+)ns\] GC\(\d+\) Concurrent Mark Cycle ([0-9.]+)ms$', line.strip())
        if m:
            end = int(m.group(1))
            marks.append((end - float(m.group(2)) * 1e6, end))
    return sorted(pauses), sorted(marks)


def inside(t, spans):
    i = bisect.bisect_right(spans, (t, float('inf'))) - 1
    return i >= 0 and spans[i][0] <= t <= spans[i][1]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    recs = list(read_trace(sys.argv[1]))
    if not recs:
        sys.exit(f'{sys.argv[1]}: no faults')
    by = collections.Counter(r[1] for r in recs)
    print(f'faults {len(recs)} over {recs[-1][0] / 1e9:.1f} s; by source {dict(sorted(by.items()))}')
    back = [r for r in recs if r[1] == 1]
    if not back:
        return
    if len(sys.argv) == 3:
        pauses, marks = read_gclog(sys.argv[2])
        p = sum(1 for r in back if inside(r[0], pauses))
        m = sum(1 for r in back if not inside(r[0], pauses) and inside(r[0], marks))
        print(f'backend faults in GC pauses {p} ({p / len(back):.1%}), in concurrent mark cycles {m} '
              f'({m / len(back):.1%}), elsewhere {len(back) - p - m}; pauses {len(pauses)} '
              f'({sum(b - a for a, b in pauses) / 1e9:.1f} s), mark cycles {len(marks)} '
              f'({sum(b - a for a, b in marks) / 1e9:.1f} s)')
    for w in (16, 64, 256):
        last, seq = {}, 0
        for i, r in enumerate(back):
            pg = r[2]
            if any(pg - d in last and i - last[pg - d] <= w for d in (1, 2, 3, 4)):
                seq += 1
            last[pg] = i
        print(f'backend faults 1-4 pages after one of the last {w}: {seq} ({seq / len(back):.1%})')
    last, dist = {}, []
    for i, r in enumerate(back):
        if r[2] in last:
            dist.append(i - last[r[2]])
        last[r[2]] = i
    dist.sort()
    qs = ' '.join(f'p{int(q * 100)} {dist[int(q * len(dist))]}' for q in (0.1, 0.25, 0.5, 0.75, 0.9)) if dist else '-'
    print(f'backend faults {len(back)} on {len(last)} distinct pages; between two faults on a page: {qs} backend faults')


main()
