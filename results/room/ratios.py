# Ratios of results/room/swap.csv (bin/farmem-bench's per-run rows): for each workload and cap,
# the medians of each round's farmem-program / farmem-before-program pair (the agent's room from
# below the high watermark, against the room it got before) and farmem-program / farmem (faults
# served in the program against farmem's own), each side's median over swap-zram's, and the
# median of the faults that reached farmem (the rest the program served itself).
# Run: python3 results/room/ratios.py results/room/swap.csv
import csv, statistics as st, sys

rows = [r for r in csv.DictReader(open(sys.argv[1])) if r['stopped'] == 'false' and r['oom_killed'] == 'false']
tput = {(r['workload'], r['cap_pct'], r['round'], r['config']): float(r['throughput']) for r in rows}
faults = {(r['workload'], r['cap_pct'], r['round'], r['config']): float(r['faults']) for r in rows if r['config'].startswith('farmem')}
keys = sorted({(w, c) for (w, c, _, cfg) in tput if cfg != 'native'}, key=lambda k: (k[0], -int(k[1])))
print('| workload | cap | program / before-program (median; rounds) | program / default (median; rounds) | program / zram | before-program / zram | default / zram | faults farmem served: program, before-program, default |')
print('|---|---|---|---|---|---|---|---|')
for w, c in keys:
    rounds = sorted({rd for (w2, c2, rd, _) in tput if (w2, c2) == (w, c)})
    def pairs(a, b):
        return [tput[(w, c, rd, a)] / tput[(w, c, rd, b)] for rd in rounds if (w, c, rd, a) in tput and (w, c, rd, b) in tput]
    med = lambda d, cfg: st.median([v for (w2, c2, _, cf), v in d.items() if (w2, c2, cf) == (w, c, cfg)] or [float('nan')])
    done = sum((w, c, rd, 'swap-zram') in tput for rd in rounds)
    z = med(tput, 'swap-zram')
    vs = lambda cfg: '%.2f' % (med(tput, cfg) / z) if done >= 2 else '– (zram finished %d of %d)' % (done, len(rounds))
    p1, p2 = pairs('farmem-program', 'farmem-before-program'), pairs('farmem-program', 'farmem')
    print('| %s | %s %% | %.2f; %s | %.2f; %s | %s | %s | %s | %.0f, %.0f, %.0f |' % (
        w, c, st.median(p1), ' '.join('%.2f' % x for x in p1), st.median(p2), ' '.join('%.2f' % x for x in p2),
        vs('farmem-program'), vs('farmem-before-program'), vs('farmem'),
        med(faults, 'farmem-program'), med(faults, 'farmem-before-program'), med(faults, 'farmem')))
