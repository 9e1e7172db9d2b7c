package main

import "math"

// ownMemSlack is the constant part of the target for farmem's own memory: its RSS at
// most 1.1 times the bytes its store holds and this much (its code, heap and stacks).
const ownMemSlack = 64 << 20

// ownMemory reports farmem's own memory against its embedded store, per workload and cap: the
// medians over the finished runs of the store's peak (its --summary-json's backend_peak_bytes)
// and of farmem's own peak RSS (farmem_peak_rss_bytes, the kernel's VmHWM), and whether the
// target holds. A run with a memory server keeps its pages off the machine's farmem process
// and has no row; so has a run whose summary predates farmem_peak_rss_bytes (an older CSV).
func ownMemory(p func(string, ...any), wls []workload, cfgs []config, rs []result) {
	header := false
	for _, w := range wls {
		for _, c := range cfgs {
			if c.kind != "farmem" || c.remote != "" {
				continue
			}
			rss := medianOf(rs, w.name, c, func(r result) float64 { return pos(r.farmemRSSB) })
			store := medianOf(rs, w.name, c, func(r result) float64 { return pos(r.storePeakB) })
			if math.IsNaN(rss) {
				continue
			}
			if !header {
				p("\n## farmem's own memory\n\nIssue 18's target: farmem's RSS at most 1.1x the bytes its store holds + 64 MiB. Medians of the finished runs: the embedded store's peak (`backend_peak_bytes` in farmem's --summary-json) and farmem's own peak RSS as the kernel counts it (`farmem_peak_rss_bytes`, VmHWM: its store, Go heap, code and stacks); the two peaks may come at different moments, so this checks the peak against the peak.\n\n| workload | config | cap %% | store peak MiB | farmem peak RSS MiB | 1.1x store + 64 MiB | |\n|---|---|---|---|---|---|---|\n")
				header = true
			}
			if math.IsNaN(store) {
				store = 0 // no page went to the store
			}
			limit := 1.1*store + ownMemSlack
			met := "met"
			if rss > limit {
				met = "**not met**"
			}
			p("| %s | %s | %d | %.0f | %.0f | %.0f | %s |\n", w.title, c.name(), c.pct, store/(1<<20), rss/(1<<20), limit/(1<<20), met)
		}
	}
}

// pos is v as a float, NaN when it is not positive (absent from the run's summary).
func pos(v int64) float64 {
	if v <= 0 {
		return math.NaN()
	}
	return float64(v)
}
