package fetcher

import (
	"time"

	"github.com/farmem/farmem/pagetable"
)

// nopHost is the Host of tests that exercise the fetcher's pure parts (tracing, the prefetch
// cache) without a process: pid 0, no cap, nothing to place or stop.
type nopHost struct{}

func (nopHost) Pid() int                         { return 0 }
func (nopHost) Faulting(int32)                   {}
func (nopHost) MustWait(int32) bool              { return false }
func (nopHost) Room() int64                      { return 1 << 30 }
func (nopHost) PrefetchRoom() int64              { return 1 << 30 }
func (nopHost) RoomShort()                       {}
func (nopHost) Exited() bool                     { return false }
func (nopHost) ForkChild(int32) int              { return 0 }
func (nopHost) Idle(int64) time.Duration         { return 0 }
func (nopHost) Forked(int, *pagetable.PageTable) {}
func (nopHost) Unmapped(uint64, uint64)          {}
func (nopHost) Fail(error)                       {}
func (nopHost) Hold() bool                       { return true }
func (nopHost) Release()                         {}
