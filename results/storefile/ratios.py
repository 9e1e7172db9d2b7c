# Ratios of a bin/farmem-bench CSV with farmem and farmem-before side by side: for each workload
# and cap, the median of each round's farmem / farmem-before pair, each side's median eviction
# store stage per page written, and (where the run has it) each side's median over swap-zram's.
# Run: python3 results/storefile/ratios.py results/storefile/swap.csv
import csv, statistics as st, sys

rows = [r for r in csv.DictReader(open(sys.argv[1])) if r['stopped'] == 'false' and r['oom_killed'] == 'false']
tput = {(r['workload'], r['cap_pct'], r['round'], r['config']): float(r['throughput']) for r in rows}
def store_us(r):
    pages = float(r['farmem_batch_pages'] or 0)
    return float(r['farmem_stage_store_ns']) / pages / 1e3 if pages else float('nan')
store = {(r['workload'], r['cap_pct'], r['round'], r['config']): store_us(r) for r in rows if r['config'].startswith('farmem')}
keys = sorted({(w, c) for (w, c, _, cfg) in tput if cfg != 'native'}, key=lambda k: (k[0], -int(k[1])))
zram = any(cfg == 'swap-zram' for (_, _, _, cfg) in tput)
print('| workload | cap | farmem / farmem-before (median; rounds) | store µs a page: farmem, before |'
      + (' farmem / zram | farmem-before / zram |' if zram else ''))
print('|---|---|---|---|' + ('---|---|' if zram else ''))
for w, c in keys:
    rounds = sorted({rd for (w2, c2, rd, _) in tput if (w2, c2) == (w, c)})
    pairs = [tput[(w, c, rd, 'farmem')] / tput[(w, c, rd, 'farmem-before')]
             for rd in rounds if (w, c, rd, 'farmem') in tput and (w, c, rd, 'farmem-before') in tput]
    med = lambda d, cfg: st.median([v for (w2, c2, _, cf), v in d.items() if (w2, c2, cf) == (w, c, cfg)] or [float('nan')])
    line = '| %s | %s %% | %.2f; %s | %.1f, %.1f |' % (w, c, st.median(pairs), ' '.join('%.2f' % x for x in pairs),
                                                     med(store, 'farmem'), med(store, 'farmem-before'))
    if zram:
        done = sum((w, c, rd, 'swap-zram') in tput for rd in rounds)
        z = med(tput, 'swap-zram')
        vs = lambda cfg: '%.2f' % (med(tput, cfg) / z) if done >= 2 else 'not comparable (zram finished %d of %d)' % (done, len(rounds))
        line += ' %s | %s |' % (vs('farmem'), vs('farmem-before'))
    print(line)
