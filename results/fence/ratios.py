# Ratios of results/fence/swap.csv (bin/farmem-bench's per-run rows): for each workload and cap,
# the median of each round's pair of the fenced moves (farmem) over the moves before the fence
# (farmem-before), in both fault modes, each with its rounds; the medians of the batches' move
# and drop stages in nanoseconds per page of a batch (a stage's time over the batch's pages); and
# the runs that did not finish. Any run of farmem against a -before build of itself in both fault
# modes reads the same way: LABEL (default "fenced") names the build measured in the headers.
# Run: python3 results/fence/ratios.py results/fence/swap.csv [LABEL]
import csv, statistics as st, sys

label = sys.argv[2] if len(sys.argv) > 2 else 'fenced'

all_rows = list(csv.DictReader(open(sys.argv[1])))
rows = [r for r in all_rows if r['stopped'] == 'false' and r['oom_killed'] == 'false']
failed = {}
for r in all_rows:
    if r not in rows:
        failed[(r['workload'], r['cap_pct'], r['config'])] = failed.get((r['workload'], r['cap_pct'], r['config']), 0) + 1
tput = {(r['workload'], r['cap_pct'], r['round'], r['config']): float(r['throughput']) for r in rows}
def per_page(r, stage):
    pages = float(r['farmem_batch_pages'] or 0) * float(r['farmem_batches'] or 0)
    return float(r[stage] or 0) * float(r['farmem_batches'] or 0) / pages if pages else float('nan')
stage = {}
for r in rows:
    if r['config'].startswith('farmem'):
        stage.setdefault((r['workload'], r['cap_pct'], r['config']), []).append(
            (per_page(r, 'farmem_stage_move_ns'), per_page(r, 'farmem_stage_drop_ns')))
keys = sorted({(w, c) for (w, c, _, cfg) in tput if cfg != 'native'}, key=lambda k: (k[0], -int(k[1])))
print('| workload | cap | %s / before, default mode (median; rounds) | %s / before, program mode (median; rounds) | move, drop stage ns per page of a batch: %s / before (default mode) | runs not finished |' % (label, label, label))
print('|---|---|---|---|---|---|')
for w, c in keys:
    rounds = sorted({rd for (w2, c2, rd, _) in tput if (w2, c2) == (w, c)})
    def pairs(a, b):
        return [tput[(w, c, rd, a)] / tput[(w, c, rd, b)] for rd in rounds if (w, c, rd, a) in tput and (w, c, rd, b) in tput]
    def fmt(p):
        return '%.2f; %s' % (st.median(p), ' '.join('%.2f' % x for x in p)) if p else '–'
    def stages(cfg):
        s = stage.get((w, c, cfg), [])
        return '%.0f, %.0f' % (st.median(x[0] for x in s), st.median(x[1] for x in s)) if s else '–'
    nf = ', '.join('%s %d' % (cfg, n) for (w2, c2, cfg), n in sorted(failed.items()) if (w2, c2) == (w, c)) or 'none'
    print('| %s | %s %% | %s | %s | %s / %s | %s |' % (w, c, fmt(pairs('farmem', 'farmem-before')),
          fmt(pairs('farmem-program', 'farmem-before-program')), stages('farmem'), stages('farmem-before'), nf))
