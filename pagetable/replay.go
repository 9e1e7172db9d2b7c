package pagetable

import (
	"sync/atomic"

	"github.com/farmem/farmem/backend"
)

// ReplayConfig is how Replay runs the table's policy over an access stream, as farmem run's
// evictor would: once the resident pages pass Cap - Head/2 it takes Victims, at most Batch a
// call, down to Cap - Head (the evictor's high and low watermarks, its head grown to Head).
type ReplayConfig struct {
	Cap         int   // pages
	Head        int   // pages kept free below Cap by a round of eviction; 0: a page over the cap goes as it comes
	Batch       int   // most victims asked for at once (the evictor's BatchPages)
	MaxHeat     uint8 // as PageTable.MaxHeat
	VictimBlock int   // as PageTable.VictimBlock
}

// ReplayResult is what Replay counts.
type ReplayResult struct {
	Faults   uint64 // accesses to pages not resident, first touches included
	Refaults uint64 // faults on pages evicted before: what the victim choice decides
	Runs     uint64 // contiguous runs of victims taken out: each a TLB flush for the evictor
}

// Replay runs the table's replacement policy (Install, Refaulted, Victims, CommitStaged) over
// pages, an access stream of page numbers (address >> 12). As in farmem, only faults reach the
// table: a resident page's accesses are invisible to it, and a page touched again while
// resident is simply skipped.
func Replay(pages func(yield func(uint64) bool), cfg ReplayConfig) ReplayResult {
	var res atomic.Int64
	tb := New(&res, NewSlots(backend.NewMemory()))
	tb.MaxHeat, tb.VictimBlock = cfg.MaxHeat, cfg.VictimBlock
	high, low := cfg.Cap-cfg.Head/2, cfg.Cap-cfg.Head
	var r ReplayResult
	var victims []uint64
	for pg := range pages {
		p := pg * backend.PageSize
		e := tb.Get(p)
		if e != nil && e.State == Resident {
			continue
		}
		r.Faults++
		if ne := tb.Install(p, Written, 0); e != nil {
			r.Refaults++
			tb.Refaulted(ne)
		}
		if tb.Resident() <= high {
			continue
		}
		for tb.Resident() > low {
			victims = tb.Victims(min(tb.Resident()-low, cfg.Batch), victims)
			if len(victims) == 0 {
				panic("pagetable: replay found no victim")
			}
			for k, v := range victims {
				if k == 0 || victims[k-1]+backend.PageSize != v {
					r.Runs++
				}
				tb.CommitStaged(v, tb.Get(v), 0)
			}
		}
	}
	return r
}
