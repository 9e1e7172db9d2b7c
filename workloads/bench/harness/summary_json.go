package main

import (
	"encoding/json"
	"os"
)

// farmemSummary is the part of `farmem run --summary-json FILE` the harness reads: raw numbers
// (bytes, nanoseconds), where the summary on stderr is rounded for people and changes with them.
// README.md ("Using it") documents the fields.
type farmemSummary struct {
	Faults map[string]struct {
		Count uint64 `json:"count"`
		SumNs uint64 `json:"sum_ns"`
		P50Ns int64  `json:"p50_ns"`
		P99Ns int64  `json:"p99_ns"`
	} `json:"faults"`
	Held map[string]struct {
		Count uint64 `json:"count"`
		SumNs uint64 `json:"sum_ns"`
	} `json:"held"`
	Evicted struct {
		Written      int64 `json:"written"`
		DroppedClean int64 `json:"dropped_clean"`
		Zero         int64 `json:"zero"`
	} `json:"evicted"`
	Batches struct {
		Count   int64            `json:"count"`
		StageNs map[string]int64 `json:"stage_ns"`
	} `json:"batches"`
	BytesIn            int64  `json:"bytes_in"`
	BytesOut           int64  `json:"bytes_out"`
	PeakAnonBytes      int64  `json:"peak_anon_bytes"`
	CgroupPeakBytes    *int64 `json:"cgroup_peak_bytes"`
	BackendPeakBytes   int64  `json:"backend_peak_bytes"`
	FarmemPeakRSSBytes int64  `json:"farmem_peak_rss_bytes"` // 0 from a farmem that does not report it
}

// readSummary reads farmem's --summary-json file.
func readSummary(path string) (farmemSummary, error) {
	var s farmemSummary
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(b, &s)
}

// apply puts what a farmem run's summary says into its result: its backend faults and their
// service p50/p99, the bytes moved (prefetches included), its peak (the memory cgroup's where
// farmem had one, measured as swap's is, else its sampled anonymous RSS), its store's peak and
// its own peak RSS, and its eviction stages.
func (s farmemSummary) apply(res *result) {
	b := s.Faults["backend"]
	res.faults = b.Count
	res.fsP50, res.fsP99 = float64(b.P50Ns)/1e3, float64(b.P99Ns)/1e3
	res.inB, res.outB = uint64(s.BytesIn), uint64(s.BytesOut)
	res.peakB, res.peakCgroup = s.PeakAnonBytes, false
	if s.CgroupPeakBytes != nil {
		res.peakB, res.peakCgroup = *s.CgroupPeakBytes, true
	}
	res.storePeakB, res.farmemRSSB = s.BackendPeakBytes, s.FarmemPeakRSSBytes
	res.stages = s.stages()
	res.faultNs, res.heldNs = 0, 0
	for _, f := range s.Faults {
		res.faultNs += float64(f.SumNs)
	}
	for i, why := range heldReasons {
		res.held[i] = float64(s.Held[why].Count)
		res.heldNs += float64(s.Held[why].SumNs)
	}
}

// heldReasons are why farmem's faults waited before service, as its summary names them: for
// room at the cap, for their page in a batch or being read, behind an unread event.
var heldReasons = [...]string{"room", "busy", "event"}

// stages is the summary's eviction batches: how many, their mean pages, and the mean time a
// batch spent in each stage.
func (s farmemSummary) stages() (st farmemStages) {
	n := s.Batches.Count
	if n == 0 {
		return st
	}
	st.batches = float64(n)
	st.pages = float64(s.Evicted.Written+s.Evicted.DroppedClean+s.Evicted.Zero) / float64(n)
	for i, name := range stageNames {
		st.stage[i] = float64(s.Batches.StageNs[name]) / float64(n)
	}
	return st
}
