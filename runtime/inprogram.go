package runtime

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
)

// ServeInProgram has the process's agent serve the faults it can from now on (package fetcher,
// inprogram.go; docs/DESIGN.md, "Where a fault is served"), if the run asks for it
// (Config.FaultsInProgram) and the process's pages are kept where the agent can read them: a
// store space of its own and the table of words its page table keeps. The agent gets the table,
// a read-only descriptor of the space, and one end of a socket for what it sends on. Failing
// that, farmem serves every fault itself.
func (p *Process) ServeInProgram(a Agent) {
	if !p.rt.cfg.FaultsInProgram || p.space == 0 {
		return
	}
	p.table.Lock()
	words := p.table.Words()
	p.table.Unlock()
	files, ok := p.rt.cfg.Backend.(interface{ SpaceFile(backend.Space) int })
	if words == nil || !ok {
		return
	}
	file := files.SpaceFile(p.space)
	if file < 0 {
		return
	}
	store, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", file), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		p.noInProgram(err)
		return
	}
	defer unix.Close(store)
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		p.noInProgram(err)
		return
	}
	defer unix.Close(pair[1])
	tid, err := a.ServeFaults(words.FD(), store, pair[1])
	if err != nil {
		unix.Close(pair[0])
		if !errors.Is(err, evictor.ErrGone) {
			p.noInProgram(err)
		}
		return
	}
	p.place.server.Store(int32(tid))
	p.fetch.HandOver(pair[0], words.Ctl(), grantPages(p.rt.cfg.CapPages))
}

// noInProgram says why a process's faults stay farmem's.
func (p *Process) noInProgram(err error) {
	fmt.Fprintf(os.Stderr, "farmem: process %d: its faults stay farmem's to serve: %v\n", p.Pid(), err)
}

// grantPages is the room an agent is kept at: enough that it asks farmem again rarely, little
// enough that what it holds unused is a small part of the cap.
func grantPages(capPages int64) int64 { return min(max(capPages/64, 16), 256) }
