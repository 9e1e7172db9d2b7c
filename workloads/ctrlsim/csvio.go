package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// runInfo is what a run's report says of it besides its rows.
type runInfo struct {
	Command, Commit, Date, Go string
	CPUs                      int
	WallS, CPUS               float64
	Params                    Params
}

var seriesHeader = []string{"t_s", "servers_live", "sessions", "slabs", "degraded", "rebuilding", "slabs_lost", "sessions_stopped",
	"used_mean_pages", "used_max_pages", "balance_max_over_mean", "changes", "etcd_txns", "etcd_ops", "etcd_bytes",
	"max_txn_ops", "max_txn_bytes", "etcd_state_bytes", "copies_active", "copy_bytes", "allocs_refused", "servers_declared_dead"}

var lossHeader = []string{"kind", "at_s", "servers", "replicas_gone", "bytes_gone", "detected_s", "placed_s", "restored_s",
	"slabs_lost", "copies", "copy_bytes", "max_txn_ops", "max_txn_bytes"}

var cpuHeader = []string{"kind", "count", "mean_us", "p50_us", "p99_us", "total_s"}

func secs(d time.Duration) string {
	if d < 0 {
		return ""
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
}

func writeRun(dir string, info runInfo, sim *Sim, meter *cpuMeter) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := info.Params
	run := [][]string{{"key", "value"},
		{"command", info.Command}, {"commit", info.Commit}, {"date", info.Date}, {"go", info.Go},
		{"cpus", strconv.Itoa(info.CPUs)}, {"wall_s", fmt.Sprintf("%.1f", info.WallS)}, {"cpu_s", fmt.Sprintf("%.1f", info.CPUS)},
		{"servers", strconv.Itoa(p.Servers)}, {"rack_size", strconv.Itoa(p.RackSize)}, {"sessions", strconv.Itoa(p.Sessions)},
		{"slabs_per_session", strconv.Itoa(p.SlabsPerSession)}, {"replicas", strconv.Itoa(p.Replicas)},
		{"capacity_pages", strconv.FormatUint(p.CapacityPages, 10)}, {"slab_pages", strconv.FormatUint(uint64(p.SlabPages), 10)},
		{"seed", strconv.FormatUint(p.Seed, 10)}, {"duration_s", secs(p.Duration)}, {"warmup_s", secs(p.WarmUp)},
		{"slab_turnover_s", secs(p.SlabTurnover)}, {"session_life_s", secs(p.SessionLife)},
		{"churn_from_s", secs(p.ChurnFrom)}, {"churn_every_s", secs(p.ChurnEvery)}, {"rack_losses", durations(p.RackLosses)},
		{"rack_return_s", secs(p.RackReturn)}, {"server_bw_bytes_s", fmt.Sprintf("%.0f", p.ServerBW)},
		{"client_bw_bytes_s", fmt.Sprintf("%.0f", p.ClientBW)}, {"save_every_s", secs(p.SaveEvery)}, {"save_per_change", strconv.FormatBool(p.SavePerChange)},
		{"server_interval_s", secs(p.ServerInterval)}, {"session_interval_s", secs(p.SessionInterval)},
	}
	series := [][]string{seriesHeader}
	for _, r := range sim.Rows {
		series = append(series, []string{secs(r.T), itoa(r.Servers), itoa(r.Sessions), itoa(r.Slabs), itoa(r.Degraded),
			itoa(r.Rebuilding), itoa(r.LostSlabs), itoa(r.Stopped), fmt.Sprintf("%.1f", r.UsedMeanPages), u64(r.UsedMaxPages),
			fmt.Sprintf("%.4f", r.Balance), itoa(r.Changes), itoa(r.Txns), itoa(r.Ops), itoa(r.Bytes), itoa(r.MaxTxnOps),
			itoa(r.MaxTxnBytes), itoa(r.StateBytes), itoa(r.CopiesActive), u64(r.CopyBytes), itoa(r.RefusedAllocs),
			itoa(r.ServersDeclDead)})
	}
	losses := [][]string{lossHeader}
	for _, l := range sim.Losses {
		losses = append(losses, []string{l.Kind, secs(l.At), itoa(l.Servers), itoa(l.ReplicasGone), u64(l.BytesGone),
			secs(l.DetectedAt), secs(l.PlacedAt), secs(l.RestoredAt), itoa(l.SlabsLost), itoa(l.Copies), u64(l.CopyBytes),
			itoa(l.MaxTxnOps), itoa(l.MaxTxnBytes)})
	}
	cpu := [][]string{cpuHeader}
	for _, r := range meter.rows() {
		cpu = append(cpu, []string{r.Kind, itoa(r.Count), fmt.Sprintf("%.2f", r.MeanUs), fmt.Sprintf("%.2f", r.P50Us),
			fmt.Sprintf("%.2f", r.P99Us), fmt.Sprintf("%.3f", r.TotalS)})
	}
	for name, rows := range map[string][][]string{"run.csv": run, "series.csv": series, "losses.csv": losses, "cpu.csv": cpu} {
		if err := writeCSV(filepath.Join(dir, name), rows); err != nil {
			return err
		}
	}
	return nil
}

func itoa(n int) string   { return strconv.Itoa(n) }
func u64(n uint64) string { return strconv.FormatUint(n, 10) }

func writeCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.WriteAll(rows)
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// table is a CSV read back: its rows as maps by column name.
type table []map[string]string

func readCSV(path string) (table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	var out table
	for _, r := range rows[1:] {
		m := map[string]string{}
		for i, h := range rows[0] {
			if i < len(r) {
				m[h] = r[i]
			}
		}
		out = append(out, m)
	}
	return out, nil
}

func (t table) f(i int, col string) float64 {
	v, _ := strconv.ParseFloat(t[i][col], 64)
	return v
}
