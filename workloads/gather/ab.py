"""ab.py CSV: farmem against farmem-before, side by side, from a farmem-bench run's per-run rows
(bin/farmem-bench -before BIN -configs farmem,farmem-before,...). Per workload and cap: each
side's median wall time over the runs that finished (how many finished), the ratio of the medians
(before / farmem: above 1, farmem is faster), the ratio round by round, the ratio of the median
throughputs (the workload's own metric: a server's zipfian phase, not its populate), each side's median faults
(farmem's backend faults), how the swap-zram runs ended, and farmem's median throughput over
swap-zram's where most of zram's runs finished ("not comparable" where they did not). A side none of whose runs finished has
no median: the ratio is then a bound, from the time limit the before runs were stopped at.
Prints a Markdown table."""
import csv,sys,statistics as st
from collections import defaultdict
rows=list(csv.DictReader(open(sys.argv[1])))
d=defaultdict(lambda: defaultdict(list))
for r in rows:
    if r['cap_pct']=='0': continue
    d[(r['workload'],int(r['cap_pct']))][r['config']].append(r)
print("| workload | cap | farmem s (runs) | before s (runs) | before / farmem, wall | per round | farmem / before, throughput | farmem faults | before faults | swap-zram s (runs) | farmem / swap-zram, throughput |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(d, key=lambda k:(k[0],-k[1])):
    v=d[k]
    def fin(c): return [r for r in v.get(c,[]) if r['stopped']!='true' and r['oom_killed']!='true']
    def desc(c):
        f=fin(c); n=len(v.get(c,[]))
        if not f: return "none finished (%d of %d stopped at %ss)"%(n, n, v[c][0]['wall_s'] if n else '-')
        return "%.2f (%d of %d)"%(st.median(float(r['wall_s']) for r in f), len(f), n)
    a=fin('farmem'); b=fin('farmem-before')
    ratio='-'
    if a and b: ratio="%.2f"%(st.median(float(r['wall_s']) for r in b)/st.median(float(r['wall_s']) for r in a))
    elif a and not b: ratio="> %.2f (before stopped)"%(float(v['farmem-before'][0]['wall_s'])/st.median(float(r['wall_s']) for r in a))
    tr='-'
    if a and b:
        tb=st.median(float(r['throughput']) for r in b)
        if tb > 0:
            tr="%.2f"%(st.median(float(r['throughput']) for r in a)/tb)
    pr=[]
    rounds=sorted(set(r['round'] for r in v['farmem']))
    for rd in rounds:
        x=[r for r in a if r['round']==rd]; y=[r for r in b if r['round']==rd]
        if x and y: pr.append("%.2f"%(float(y[0]['wall_s'])/float(x[0]['wall_s'])))
    fa=st.median(int(r['faults']) for r in a) if a else '-'
    fb=st.median(int(r['faults']) for r in b) if b else '-'
    z=v.get('swap-zram',[])
    zk=sum(r['oom_killed']=='true' for r in z)
    zf=[float(r['wall_s']) for r in z if r['oom_killed']!='true' and r['stopped']!='true']
    zs="%.2f s (%d of %d)"%(st.median(zf),len(zf),len(z)) if zf else ("none finished" if z else "not run")
    if zk: zs+=", %d OOM-killed"%zk
    zr='-'
    if a and len(zf)*2 > len(z):
        tz=st.median(float(r['throughput']) for r in z if r['oom_killed']!='true' and r['stopped']!='true')
        if tz > 0:
            zr="%.2f"%(st.median(float(r['throughput']) for r in a)/tz)
    elif z:
        zr="not comparable"
    print("| %s | %d %% | %s | %s | %s | %s | %s | %s | %s | %s | %s |"%(k[0],k[1],desc('farmem'),desc('farmem-before'),ratio,' '.join(pr) or '-',tr,fa,fb,zs,zr))
