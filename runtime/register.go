package runtime

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/uffd"
)

// RegisterMode is how every range is registered: MISSING for first touch and re-fault, WP for
// dirty tracking and the eviction protocol.
const RegisterMode = uffd.ModeMissing | uffd.ModeWP

// Register registers [start, start+length) with the process's uffd and adopts its present
// pages. Before the run is armed it does nothing: arming rescans every mapping.
//
// Register and Rescan hold the process's life (Hold) across their calls on its uffd: retire
// closes the uffd, whose number may be another process's by then, and unmaps the control page
// through which adopt asks the kernel in program mode.
func (p *Process) Register(start, length uint64) error {
	if !p.rt.Armed() {
		return nil
	}
	if !p.Hold() {
		return nil // retired, or being detached: nothing of it is served any more
	}
	defer p.Release()
	fresh, err := p.register(start, length)
	if err != nil || !fresh {
		return err
	}
	_, again, err := p.adopt(start, length)
	if again {
		p.adoptLater(start, length)
	}
	return err
}

// adoptLater has the next Rescan adopt [start, start+length) again: an event not read yet kept
// adopt from telling whether some of its present pages are ours. Left untracked, they would
// never be evicted, and the cap would not hold.
func (p *Process) adoptLater(start, length uint64) {
	p.regMu.Lock()
	p.unadopted[start] = start + length
	p.regMu.Unlock()
}

// register registers [start, start+length) unless it is already; fresh reports whether it
// was not, so its present pages still need adopting.
func (p *Process) register(start, length uint64) (fresh bool, err error) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	if end, ok := p.registered[start]; (ok && end == start+length) || p.detaching.Load() {
		return false, nil
	}
	if _, err := uffd.Register(p.fd, start, length, RegisterMode); err != nil {
		return false, err
	}
	p.registered[start] = start + length
	return true, nil
}

// adopt records the pages of a just-registered range that are already present: the program
// touched them before we could register (glibc's internal brk/mmap). They have no stored copy.
//
// Only pages in a mapping registered with the process's uffd are adopted (ours). The range can
// change between its registration and the pagemap read: a MAP_FIXED too small for the filter
// to hand over (a Go runtime's page-allocator summary, a page at a time) replaces part of it
// with a mapping nobody registered, which the program then writes. Adopted, such a page would
// be evicted, and the program's next read of it would find the kernel's zero page, not a
// fault. The table stays locked from the check to the record, so an UNMAP that replaces the
// mapping after the check is applied after the record, and discards it.
//
// Nor is a page the program is discarding: its REMOVE event is read (and applied) before the
// kernel zaps it, so pagemap, and the check, can still find it present after the event.
// Adopted, it would be recorded resident and then vanish: its next touch would fault on a
// record that says farmem has nothing to serve, and the process would be stopped. The table
// remembers the program's discards for as long as a zap can lag its event (Discarding).
//
// again reports pages it could not check: an event not read yet fails the check (ours), and
// the range is to be adopted again later (adoptLater); what it adopted now it skips then.
func (p *Process) adopt(start, length uint64) (adopted int64, again bool, err error) {
	pid := p.Pid()
	if pid == 0 {
		return 0, false, nil
	}
	n := length / PageSize
	buf := make([]uint64, min(n, 8192))
	for off := uint64(0); off < n; {
		k := min(n-off, uint64(len(buf)))
		if err := procfs.Pagemap(pid, start+off*PageSize, buf[:k]); err != nil {
			return adopted, again, err
		}
		p.table.Lock()
		now := time.Now()
		chunk := start + off*PageSize
		discarding := p.table.Discarding(chunk, chunk+k*PageSize, now)
		// The staging area's pages are not the program's (the kernel may have merged it with a
		// neighbour, so a mapping can hold it).
		adoptable := func(i uint64) bool {
			page := chunk + i*PageSize
			return procfs.Present(buf[i]) && p.table.Get(page) == nil && !p.table.InStaging(page) &&
				!(discarding && p.table.Discarding(page, page+PageSize, now))
		}
		for i := uint64(0); i < k; {
			if !adoptable(i) {
				i++
				continue
			}
			page := chunk + i*PageSize
			j := i + 1 // the run of pages to adopt from i
			for j < k && adoptable(j) {
				j++
			}
			switch mine, wait := p.ours(page, (j-i)*PageSize); {
			case wait:
				again = true
			case mine:
				for q := i; q < j; q++ {
					p.table.Adopt(page + (q-i)*PageSize)
				}
				adopted += int64(j - i)
			default:
				for q := i; q < j; q++ { // the run crosses mappings, or holds one not ours
					pg := page + (q-i)*PageSize
					mine, wait := p.ours(pg, PageSize)
					if mine {
						p.table.Adopt(pg)
						adopted++
					}
					again = again || wait
				}
			}
			i = j
		}
		p.table.Unlock()
		off += k
	}
	return adopted, again, nil
}

// ours reports whether [start, start+length), whose first page is present, lies in one mapping
// registered with the process's uffd (mine): a zero-page request there checks the mapping first
// (ENOENT if it is not one registered mapping of ours), then finds the first page present
// (EEXIST) and installs nothing. wait: the kernel could not tell (EAGAIN: an event not read yet,
// or read by the agent and not applied yet, which may be the mapping's replacement or move), and
// the question is to be asked again once it is read. Anything else is no.
func (p *Process) ours(start, length uint64) (mine, wait bool) {
	_, err := p.fetch.ZeroPage(start, length, uffd.ZeroPageDontWake)
	return errors.Is(err, unix.EEXIST), errors.Is(err, unix.EAGAIN)
}

// Rescan registers every mapping of the process that registrable accepts and returns how many
// pages it found present in them (pages the program took unseen), and adopts again the ranges
// whose adoption was cut short (adoptLater).
func (p *Process) Rescan() (adopted int64) {
	if !p.Hold() {
		return 0 // retired, or being detached
	}
	defer p.Release()
	// Register every mapping first and adopt after: from its registration on, a mapping's new
	// pages fault (and count against the cap); adopting first would leave the later mappings
	// open to untracked growth for as long as the pagemap reads take.
	var fresh [][2]uint64
	p.regMu.Lock()
	for start, end := range p.unadopted {
		fresh = append(fresh, [2]uint64{start, end - start})
	}
	clear(p.unadopted)
	p.regMu.Unlock()
	err := procfs.Maps(p.Pid(), func(m procfs.Mapping) {
		if !registrable(m, p.rt.cfg.MinRegister) {
			return
		}
		if ok, _ := p.register(m.Start, m.End-m.Start); ok { // EINVAL/ENOMEM: the mapping changed meanwhile
			fresh = append(fresh, [2]uint64{m.Start, m.End - m.Start})
		}
	})
	if err != nil {
		return 0 // it has exited
	}
	for _, r := range fresh {
		n, again, _ := p.adopt(r[0], r[1])
		adopted += n
		if again {
			p.adoptLater(r[0], r[1])
		}
	}
	return adopted
}

// registrable reports whether farmem registers mapping m: private anonymous memory of at least
// minBytes, read-write or a reservation with no access yet (glibc reserves a thread arena's
// 64 MiB that way and opens it with mprotect as it grows, and a registration survives that
// mprotect), or the heap; not a file, the main stack, vdso or vvar.
func registrable(m procfs.Mapping, minBytes uint64) bool {
	return (m.Perms == "rw-p" || m.Perms == "---p") && m.Inode == 0 && (m.Path == "" || m.Path == "[heap]") &&
		m.End-m.Start >= minBytes
}

// forgetRange drops registrations inside [start, end) (UNMAP, or a REMAP's source).
func (p *Process) forgetRange(start, end uint64) {
	p.regMu.Lock()
	for s, e := range p.registered {
		if s < end && e > start {
			delete(p.registered, s)
		}
	}
	for s, e := range p.unadopted {
		if s < end && e > start {
			delete(p.unadopted, s)
		}
	}
	p.regMu.Unlock()
}

func pageUp(n uint64) uint64 { return (n + PageSize - 1) &^ (PageSize - 1) }
