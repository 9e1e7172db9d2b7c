package runtime

import (
	"errors"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/uffd"
)

// A FORK event carries the child's uffd and nothing that names the child. Two threads of one
// process can fork at once, and their children say hello in either order; matched the wrong
// way round, each child would be served on its sibling's uffd with its sibling's page table,
// and its pages read from the wrong process: zeros, or another child's data. So a child names
// its own event by a page that only its own memory holds at that address (its fork probe), and
// the runtime asks each waiting event's uffd about that page.

// claimForkLocked takes out of the waiting FORK events of every parent (rt.mu held), live or
// gone, the one whose uffd mine says is the child's, or returns nil if none does yet. Two that
// say so are an error, not a guess. mine may make ioctls on the fd, and nothing else of the
// runtime.
func (rt *Runtime) claimForkLocked(mine func(fd int) bool) (*Process, error) {
	var found *Process
	for _, q := range rt.forks {
		for _, c := range q {
			if mine(c.fd) {
				if found != nil {
					return nil, errors.New("two waiting FORK events claim it")
				}
				found = c
			}
		}
	}
	if found != nil {
		rt.unqueueForkLocked(found)
	}
	return found, nil
}

// unqueueForkLocked takes c out of its parent's waiting FORK events, if it is there (rt.mu held).
func (rt *Runtime) unqueueForkLocked(c *Process) {
	f := c.forkParent
	if f == nil {
		return
	}
	rt.forks[f] = slices.DeleteFunc(rt.forks[f], func(q *Process) bool { return q == c })
	if len(rt.forks[f]) == 0 {
		delete(rt.forks, f)
	}
}

// probeOwner answers, for a child whose fork probe is the page at probe, whether uffd fd is its
// own. The child registered the page on a uffd of its own, so its own FORK uffd cannot register
// it: EBUSY. A sibling's finds nothing there (EINVAL), or, at worst, a mapping of its own, which
// the request registers the way the runtime registers every range (RegisterMode): a range the
// runtime registered is left as it was, and an unregistered one then reads as it would have,
// its first touches served as zero fills.
func probeOwner(probe uint64) func(fd int) bool {
	return func(fd int) bool {
		_, err := uffd.Register(fd, probe, uint64(PageSize), RegisterMode)
		return errors.Is(err, unix.EBUSY)
	}
}
