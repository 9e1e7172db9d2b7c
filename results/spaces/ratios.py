import csv,sys,statistics as st
for path in sys.argv[1:]:
    rows=list(csv.DictReader(open(path)))
    by={}
    for r in rows:
        if r['config'] in ('farmem','farmem-before'):
            by[(r['workload'],r['cap_pct'],r['round'],r['config'])]=r
    res={}
    for (w,c,rd,cfg),r in sorted(by.items()):
        if cfg!='farmem': continue
        b=by[(w,c,rd,'farmem-before')]
        res.setdefault((w,c),[]).append(float(r['throughput'])/float(b['throughput']))
    for k,v in res.items():
        print(path.split('/')[-2], k, 'median %.2f'%st.median(v), ' '.join('%.2f'%x for x in v))
