package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// capSlack is what a farmem run's memory cgroup may hold beyond the zram run's limit (the cap
// plus the kernel memory the native run was charged), as in cmd/farmem's tests: the cap is met
// a batch late, by the pages faulted in while an eviction batch is in flight, and the cgroup
// also counts page cache and the shim's agent. The table reports the peak against the limit
// without it.
const capSlack = 4 << 20

// The reach table's fast subset: four of its programs at small sizes, each run natively and
// under farmem at a quarter of its native peak by the table's own code. The output must equal
// the native run's and the run's memory cgroup must stay within the cap. No timing is checked.
func TestReachSubset(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the reach table runs as root (memory cgroups, userfaultfd): make test runs as root")
	}
	repoRoot = filepath.Join("..", "..")
	farmem := filepath.Join(repoRoot, "bin", "farmem")
	if _, err := os.Stat(farmem); err != nil {
		t.Fatalf("%s missing: run `make build` first (make test does)", farmem)
	}
	workDir = t.TempDir()
	sizes := map[string]float64{
		"numpy":   0.3, // a dynamic program (the shim preloaded)
		"sqlite3": 0.35,
		"gofmt":   0.4, // a static Go program (injection)
		"redis":   0.2, // a server, driven from here
	}
	all := map[string]*program{}
	for _, p := range programs() {
		all[p.name] = p
	}
	for _, name := range []string{"numpy", "sqlite3", "gofmt", "redis"} {
		t.Run(name, func(t *testing.T) {
			p := all[name]
			for _, b := range p.needs {
				if _, err := os.Stat(b); err != nil {
					t.Fatalf("%s is not installed (scripts/test-deps.sh installs it)", b)
				}
			}
			r := &reach{farmem: farmem, scale: sizes[name], pct: 25, factor: 20, minTimeout: time.Minute,
				configs: map[string]bool{"farmem": true}}
			rows := r.program(p)
			if len(rows) != 2 {
				t.Fatalf("rows %+v: want native and farmem", rows)
			}
			nat, fm := rows[0], rows[1]
			if nat.status != "ok" {
				t.Fatalf("natively: %s: %s", nat.status, nat.detail)
			}
			t.Logf("native peak %.1f MiB, cap %.1f MiB, limit %.1f MiB; farmem peak %.1f MiB (%s)",
				mib(nat.peakB), mib(fm.capB), mib(fm.limitB), mib(fm.peakB), fm.peakSrc)
			if nat.peakB < fm.capB+capSlack {
				t.Fatalf("native peak %.1f MiB: too small for the cap %.1f MiB to matter", mib(nat.peakB), mib(fm.capB))
			}
			if fm.status != "ok" {
				t.Fatalf("under farmem: %s: %s (native digest %s, farmem's %s)", fm.status, fm.detail, nat.digest, fm.digest)
			}
			if fm.digest != nat.digest {
				t.Fatalf("under farmem the digest is %s, natively %s", fm.digest, nat.digest)
			}
			if fm.peakSrc != "cgroup" {
				t.Fatalf("no cgroup peak in farmem's summary (%q)", fm.peakSrc)
			}
			if fm.peakB > fm.limitB+capSlack {
				t.Errorf("the run's memory cgroup peaked at %.1f MiB, over the limit %.1f MiB and %d MiB", mib(fm.peakB), mib(fm.limitB), capSlack>>20)
			}
		})
	}
}
