package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// etcd's defaults that bound one transaction (etcd's --max-txn-ops and --max-request-bytes).
const (
	etcdMaxTxnOps   = 128
	etcdMaxReqBytes = 1536 * 1024
)

// renderDir makes DIR/ctrlsim.md and DIR/ctrlsim.svg from DIR's CSVs alone.
func renderDir(dir string) error {
	runT, err := readCSV(filepath.Join(dir, "run.csv"))
	if err != nil {
		return err
	}
	run := map[string]string{}
	for _, r := range runT {
		run[r["key"]] = r["value"]
	}
	series, err := readCSV(filepath.Join(dir, "series.csv"))
	if err != nil {
		return err
	}
	losses, err := readCSV(filepath.Join(dir, "losses.csv"))
	if err != nil {
		return err
	}
	cpu, err := readCSV(filepath.Join(dir, "cpu.csv"))
	if err != nil {
		return err
	}
	if len(series) == 0 {
		return fmt.Errorf("%s/series.csv has no rows", dir)
	}
	num := func(k string) float64 { v, _ := strconv.ParseFloat(run[k], 64); return v }
	sv := func(k string) string { return trimFloat(num(k)) } // a number of run.csv, as few digits as it needs
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	gib := func(bytes float64) string { return fmt.Sprintf("%.1f", bytes/(1<<30)) }
	mib := func(bytes float64) string { return fmt.Sprintf("%.2f", bytes/(1<<20)) }

	w("# The ctrl at %s memory servers and %s sessions, by simulation\n\n", run["servers"], run["sessions"])
	w("Made by `make bench-ctrlsim`, which ran `%s`, at commit %s on %s (%s, %s CPUs): %s s of CPU in all (%s s wall). ",
		run["command"], run["commit"], run["date"], run["go"], run["cpus"], run["cpu_s"], run["wall_s"])
	w("The raw rows are beside this file: series.csv (one row per %s s of simulated time), losses.csv (one row per loss of servers), cpu.csv (the CPU of each kind of call) and run.csv (the parameters); `go run ./workloads/ctrlsim -render %s` re-makes this report and the plot from them. ", trimFloat(series.f(0, "t_s")), dir)
	w("Everything but cpu.csv and the CPU figures is deterministic: the same command at the same commit writes the same rows.\n\n")

	w("## What runs\n\n")
	w("The ctrl's own state machine (`ctrl.Cluster`, the code `farmem ctrl` runs), driven on one goroutine with a simulated clock: every call is the ctrl's method with the simulated time, nothing is re-implemented. Around it:\n\n")
	w("- **Servers**: %s memory servers of %s GiB in racks of %s, heartbeating every %s s with what they hold (as `farmem memserver` does); each frees what the ctrl's reply tells it to. ", run["servers"], gib(num("capacity_pages")*4096), run["rack_size"], sv("server_interval_s"))
	w("From %s s on, every %s s one server leaves and a new one joins its rack. The ctrl has no drain: a server that leaves stops heartbeating and is, to the ctrl, a dead server (its copies go with it). ", sv("churn_from_s"), sv("churn_every_s"))
	w("At %s the live servers of a whole rack stop at once; %s s later the rack comes back as new server instances.\n", strings.ReplaceAll(run["rack_losses"], ",", " and "), sv("rack_return_s"))
	w("- **Sessions**: %s client sessions, opened over the first %s s, each holding 1 to %d slabs of %s MiB (mean %s) at %s replicas, allocating one a second until it has them; ",
		run["sessions"], sv("warmup_s"), 2*int(num("slabs_per_session"))-1, fmt.Sprint(num("slab_pages")*4096/(1<<20)), run["slabs_per_session"], run["replicas"])
	w("each frees its oldest slab and allocates a new one every %s s on average (exponential), and ends after %s s on average, replaced at once by a new session. ", sv("slab_turnover_s"), sv("session_life_s"))
	w("They heartbeat every %s s; when the generation moves they fetch their slab map and fill each replacement replica from a ready copy, then call ReplicaReady (as remote/maintain.go does). A session that finds a slab lost stops (its program is stopped: it never serves zeros) and a new one takes its place.\n", sv("session_interval_s"))
	w("- **Copies** (the restore times are this model's): a copy crosses three NICs, the source server's sending side, the client host's, and the target server's receiving side, each of %.0f Gbit/s each way; every NIC shares its bandwidth equally among the copies crossing it, and a copy moves at the smallest of its three shares, recomputed whenever a copy starts or ends. A copy moves the whole slab (an upper bound: a client copies the pages it has handed out). \n", num("server_bw_bytes_s")*8/1e9)
	w("- **etcd**: every %s s the service's tick advances the machine and, if the state changed, saves it", sv("save_every_s"))
	if run["save_per_change"] == "true" {
		w(", and so does every request that changed the state, before it is answered (the service's pace when requests come one at a time)")
	}
	w(": `ctrl.State()` then `ctrl.EtcdSaveTxn`, the function `EtcdStore.Save` calls to build its transaction, diffed against what the previous save wrote, exactly as the store diffs. Counted: transactions, their operations (puts and deletes: one key per server, one per session, and the meta key every time), and their bytes (keys plus values; etcd adds framing and the revision compare, and each member writes the entry to its log). ")
	if run["save_per_change"] != "true" {
		w("The real service saves before it answers each request that changed the state, and requests arriving during a save share the next one; so it issues between this many transactions and one per change (the `changes` column; `-save-per-change` simulates that pace), with the same keys written.")
	}
	w("\n\n")

	// Balance.
	warm := num("warmup_s") + 1
	var bal []float64
	for i := range series {
		if series.f(i, "t_s") > warm+2 {
			bal = append(bal, series.f(i, "balance_max_over_mean"))
		}
	}
	w("## Placement balance\n\n")
	w("Used pages per live server as the servers report them: the fullest over the mean (1.0 is perfect). Power of two choices on free memory, replicas on distinct servers.\n\n")
	if len(bal) > 0 {
		s := slices.Clone(bal)
		slices.Sort(s)
		w("After the warm-up (from %.0f s): median %.3f, worst %.3f, best %.3f over %d intervals.\n\n", warm+2, s[len(s)/2], s[len(s)-1], s[0], len(s))
	}
	w("| t s | live servers | sessions | slabs | used mean GiB | used max GiB | max/mean | degraded | slabs lost so far | sessions stopped so far |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	step := max(1, len(series)/24)
	for i := 0; i < len(series); i += step {
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", trimFloat(series.f(i, "t_s")), series[i]["servers_live"], series[i]["sessions"], series[i]["slabs"],
			gib(series.f(i, "used_mean_pages")*4096), gib(series.f(i, "used_max_pages")*4096), fmt.Sprintf("%.3f", series.f(i, "balance_max_over_mean")), series[i]["degraded"], series[i]["slabs_lost"], series[i]["sessions_stopped"])
	}
	w("\n![balance and etcd bytes over time](ctrlsim.svg)\n\n")

	// Losses.
	w("## Restoring every replica after each loss\n\n")
	w("Times are from the moment the servers stopped. *Detected*: the ctrl declared the last of them dead (no heartbeat for its DeadAfter). *Placed*: the last replacement placed. *Restored*: every slab again had all its replicas, ready (checked every tick). Losses that overlap share their copies and restore time. A slab whose every copy was on the lost servers is lost: placement does not know racks.\n\n")
	w("| loss | at s | servers | replicas gone | GiB gone | detected +s | placed +s | restored +s | slabs lost | copies | GiB copied | largest txn ops | largest txn MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	rel := func(i int, col string) string {
		if losses[i][col] == "" {
			return "never"
		}
		return fmt.Sprintf("%.2f", losses.f(i, col)-losses.f(i, "at_s"))
	}
	for i := range losses {
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", losses[i]["kind"], trimFloat(losses.f(i, "at_s")), losses[i]["servers"], losses[i]["replicas_gone"],
			gib(losses.f(i, "bytes_gone")), rel(i, "detected_s"), rel(i, "placed_s"), rel(i, "restored_s"), losses[i]["slabs_lost"], losses[i]["copies"],
			gib(losses.f(i, "copy_bytes")), losses[i]["max_txn_ops"], mib(losses.f(i, "max_txn_bytes")))
	}
	w("\n")

	// etcd.
	inRecovery := func(t float64) bool {
		for i := range losses {
			end := losses.f(i, "restored_s")
			if losses[i]["restored_s"] == "" {
				end = 1e18
			}
			if t > losses.f(i, "at_s") && t-series.f(0, "t_s") < end {
				return true
			}
		}
		return false
	}
	type agg struct{ n, txns, ops, bytes, changes, maxOps, maxBytes float64 }
	var steady, recov agg
	for i := range series {
		t := series.f(i, "t_s")
		if t <= warm+2 {
			continue
		}
		a := &steady
		if inRecovery(t) {
			a = &recov
		}
		a.n++
		a.txns += series.f(i, "etcd_txns")
		a.ops += series.f(i, "etcd_ops")
		a.bytes += series.f(i, "etcd_bytes")
		a.changes += series.f(i, "changes")
		a.maxOps = max(a.maxOps, series.f(i, "max_txn_ops"))
		a.maxBytes = max(a.maxBytes, series.f(i, "max_txn_bytes"))
	}
	interval := series.f(0, "t_s")
	w("## etcd writes\n\n")
	w("Per second of simulated time, after the warm-up. *Recovery*: the intervals from a loss until its replicas were restored; *steady*: the others (churn's single leaves are in recovery too).\n\n")
	w("| period | intervals | txns/s | keys written/s | MiB/s | state changes/s | largest txn ops | largest txn MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range []struct {
		name string
		a    agg
	}{{"steady", steady}, {"recovery", recov}} {
		if x.a.n == 0 {
			continue
		}
		secs := x.a.n * interval
		w("| %s | %.0f | %.1f | %.0f | %s | %.0f | %.0f | %s |\n", x.name, x.a.n, x.a.txns/secs, x.a.ops/secs, mib(x.a.bytes/secs), x.a.changes/secs, x.a.maxOps, mib(x.a.maxBytes))
	}
	last := len(series) - 1
	w("\nThe state etcd holds at the end: %s MiB (%s servers' keys and %s sessions' keys). etcd's defaults take at most %d operations and %s MiB in one transaction: ",
		mib(series.f(last, "etcd_state_bytes")), series[last]["servers_live"], series[last]["sessions"], etcdMaxTxnOps, mib(etcdMaxReqBytes))
	over := 0
	maxOps, maxBytes := 0.0, 0.0
	for i := range series {
		if series.f(i, "max_txn_ops") > etcdMaxTxnOps || series.f(i, "max_txn_bytes") > etcdMaxReqBytes {
			over++
		}
		maxOps = max(maxOps, series.f(i, "max_txn_ops"))
		maxBytes = max(maxBytes, series.f(i, "max_txn_bytes"))
	}
	w("the largest transaction here has %.0f operations and %s MiB, and %d of %d intervals had one over a default (the store then refuses the save and names the flag to raise).\n\n", maxOps, mib(maxBytes), over, len(series))

	// CPU.
	dur := num("duration_s")
	w("## The ctrl's CPU per decision\n\n")
	w("Measured: the CPU time of the simulation's thread around each call (CLOCK_THREAD_CPUTIME_ID; the garbage collector's background work runs on other threads and is not in it). These figures are the only ones that vary between runs, and they depend on the machine; %s's run had %s s of CPU in all. The state machine's part only: the HTTP, TLS and JSON of each request are not in it, and the service ticks the machine once more before each call. Every call first ticks the machine (a tick with nothing due scans the servers and sessions without sorting), so each request pays for the cluster's size.\n\n", run["commit"], run["cpu_s"])
	w("| call | count | mean µs | p50 µs | p99 µs | CPU s in all | CPU s per simulated s |\n|---|---:|---:|---:|---:|---:|---:|\n")
	var total float64
	for i := range cpu {
		total += cpu.f(i, "total_s")
		w("| %s | %s | %s | %s | %s | %s | %.3f |\n", cpu[i]["kind"], cpu[i]["count"], cpu[i]["mean_us"], cpu[i]["p50_us"], cpu[i]["p99_us"], cpu[i]["total_s"], cpu.f(i, "total_s")/dur)
	}
	w("| all | | | | | %.1f | %.2f |\n\n", total, total/dur)
	w("The last column is the CPU the ctrl would need per second of real time to keep up with this cluster at the heartbeat rates above, on one core: its decisions are serialized under one mutex (Service.mu), and its saves under another (saveMu).\n\n")

	w("## Where the design stops scaling\n\n")
	saveMean, saveTotal, allocMean := 0.0, 0.0, 0.0
	for i := range cpu {
		switch cpu[i]["kind"] {
		case kindNames[kindSave]:
			saveMean, saveTotal = cpu.f(i, "mean_us"), cpu.f(i, "total_s")
		case kindNames[kindAlloc]:
			allocMean = cpu.f(i, "mean_us")
		}
	}
	w("- **Whole-state saves.** Every save builds the whole State (every slab of every session, each grant signed) and encodes every key to find the few that changed: %.1f ms of CPU per save here, for a store of %s MiB, growing with servers × slabs. Saving at most once per %s s tick, that is %.2f CPU s per simulated second here; saving per request, as the service does when requests come one at a time, costs that much per allocation. What would change it: the state machine marking the servers and sessions it changed, so a save encodes only those (the transaction is already per key), or keys per slab (`sessions/ID/slabs/N`), so a replacement rewrites one slab rather than its session's whole map.\n",
		saveMean/1e3, mib(series.f(last, "etcd_state_bytes")), sv("save_every_s"), saveTotal/dur)
	w("- **One transaction for a whole loss.** A server's death changes every session with a slab on it, and all of it is one save: the largest transaction here, %.0f operations and %s MiB, against etcd's defaults of %d and %s MiB. Past them the ctrl cannot save at all (and so places nothing) until etcd is restarted with larger limits, and etcd is built for small values: its docs say larger requests raise the latency of the others. What would change it: saving a large change in several transactions (each conditioned on the revision the last one made), or per-slab keys, which also make each operation small.\n",
		maxOps, mib(maxBytes), etcdMaxTxnOps, mib(etcdMaxReqBytes))
	w("- **Placement lists every server.** For each replica an allocation lists the live servers with room, in id order (each server's granted-but-unreported pages are a running sum, so its free memory is read at once): %.0f µs of CPU per allocation here, growing with the servers. What would change it: sampling the two candidates of power of two choices directly rather than listing and sorting every server with room.\n", allocMean)
	w("- **Every request ticks.** Each call first checks every server and session for expiry (without sorting when nothing is due): linear in the cluster, times the heartbeat rate, itself linear in the cluster. What would change it: the service ticking on its timer only, with expiries kept in a heap by deadline.\n")
	lostTotal := 0.0
	for i := range losses {
		lostTotal += losses.f(i, "slabs_lost")
	}
	w("- **No failure domains.** Replicas go to distinct servers, not distinct racks: the losses above lost %.0f slabs in all, each stopping its session's program. What would change it: the servers reporting a rack (or zone) and placement choosing each replica's candidates among racks the slab does not use yet.\n", lostTotal)
	w("- **No drain.** A server that leaves gracefully is, to the ctrl, a dead one: its copies are gone before any replacement is filled. What would change it: a leave that marks the server draining, re-places its slabs while it still serves the copies, and lets it go once they are ready.\n")
	w("- **One leader decides everything.** Sharding the state by slab range (or by session), each shard with its own etcd prefix, revision and leader, would split both the CPU above and the transactions; a rack loss would then touch every shard at once, each restoring its own part.\n")

	if err := os.WriteFile(filepath.Join(dir, "ctrlsim.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ctrlsim.svg"), []byte(plot(series, losses, warm)), 0o644)
}
