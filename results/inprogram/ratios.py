# Ratios of results/inprogram/swap.csv (bin/farmem-bench's per-run rows): for each workload and
# cap, the medians of farmem-program / farmem (each round's pair), and each side's median over
# swap-zram's. Run: python3 results/inprogram/ratios.py results/inprogram/swap.csv
import csv, statistics as st, sys

rows = list(csv.DictReader(open(sys.argv[1])))
tput = {}
for r in rows:
    if r['stopped'] == 'false' and r['oom_killed'] == 'false':
        tput[(r['workload'], r['cap_pct'], r['round'], r['config'])] = float(r['throughput'])
keys = sorted({(w, c) for (w, c, _, cfg) in tput if cfg != 'native'}, key=lambda k: (k[0], -int(k[1])))
print('| workload | cap | farmem-program / farmem (median; rounds) | farmem / zram | farmem-program / zram |')
print('|---|---|---|---|---|')
for w, c in keys:
    pairs = [tput[(w, c, rd, 'farmem-program')] / tput[(w, c, rd, 'farmem')]
             for rd in '123' if (w, c, rd, 'farmem-program') in tput and (w, c, rd, 'farmem') in tput]
    med = lambda cfg: st.median([v for (w2, c2, _, cf), v in tput.items() if (w2, c2, cf) == (w, c, cfg)] or [float('nan')])
    z = med('swap-zram')
    done = sum((w, c, rd, 'swap-zram') in tput for rd in '123')
    vs = lambda cfg: '%.2f' % (med(cfg) / z) if done >= 2 else 'not comparable (zram finished %d of 3)' % done
    print('| %s | %s %% | %.2f; %s | %s | %s |' % (w, c, st.median(pairs), ' '.join('%.2f' % x for x in pairs),
                                                vs('farmem'), vs('farmem-program')))
