package pubtable

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The control page and the posts follow the words in the table's memfd. Both sides map them;
// the layout is launcher/shim/agent.h's struct fm_ctl and struct fm_post.
const (
	// CtlOffset is the control page's offset in the memfd.
	CtlOffset = Size
	// PostsOffset is the posts' offset: a ring of Posts records the agent writes, one for each
	// fault it served, and farmem reads in order.
	PostsOffset = Size + 4096
	Posts       = 4096
	postBytes   = 32
	// FileSize is the memfd's length.
	FileSize = PostsOffset + Posts*postBytes
)

// The control page's words.
const (
	ctlLock          = iota // 0 free; lockAgent while the agent reads the uffd; lockFarmem while farmem installs
	ctlEventsRead           // the agent: events it has read from the uffd, counted before it lets go of the lock
	ctlEventsApplied        // farmem: events it has applied to the page table
	ctlRoom                 // pages the agent may still install: farmem adds, the agent takes one an install
	ctlPostHead             // farmem: posts read
	ctlPostTail             // the agent: posts written
	ctlServed               // the agent: faults it served
	ctlForwarded            // the agent: faults it sent on to farmem
	ctlWords
)

const (
	lockAgent  = 1
	lockFarmem = 2
)

// GuessWritable, or'd into a Published word: the page is to be installed writable even on a
// read, as farmem's own install would (pagetable's Refetch: its last stay wrote it).
const GuessWritable = 8

// Dirt of a post: how the agent installed the page (pagetable.Dirt's values).
const (
	PostClean        = 0 // write-protected: a read fault, no guess
	PostWritten      = 1 // writable: a write fault
	PostGuessWritten = 2 // writable on GuessWritable
)

// Ctl is the control page and the posts, as farmem sees them.
type Ctl struct {
	fd    int
	w     *[ctlWords]atomic.Uint64
	posts *[Posts][4]atomic.Uint64
	mem   []byte
}

func mapCtl(fd int) (*Ctl, error) {
	b, err := unix.Mmap(fd, CtlOffset, FileSize-CtlOffset, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("pubtable: mapping the control page: %w", err)
	}
	return &Ctl{
		fd:    fd,
		w:     (*[ctlWords]atomic.Uint64)(unsafe.Pointer(&b[0])),
		posts: (*[Posts][4]atomic.Uint64)(unsafe.Pointer(&b[PostsOffset-CtlOffset])),
		mem:   b,
	}, nil
}

// LockInstall takes the lock farmem holds across each install of its own into the process,
// and reports whether every event the agent has read from the uffd is applied. With the lock
// held the agent reads nothing, so an event it has not read yet holds farmem's install in the
// kernel (EAGAIN), as when farmem reads the uffd itself; one it has read and farmem has not
// applied must be applied first: the caller then unlocks and tries again later. It gives up
// after a while (false, unlocked): the agent may be stopped with the lock, or gone.
func (c *Ctl) LockInstall() bool {
	for i := 0; ; i++ {
		if c.w[ctlLock].CompareAndSwap(0, lockFarmem) {
			break
		}
		if i >= 1000 {
			return false
		}
		if i < 100 {
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
	if c.w[ctlEventsRead].Load() != c.w[ctlEventsApplied].Load() {
		c.w[ctlLock].Store(0)
		return false
	}
	return true
}

// UnlockInstall lets go of LockInstall's lock.
func (c *Ctl) UnlockInstall() { c.w[ctlLock].Store(0) }

// Applied counts n more events applied to the page table.
func (c *Ctl) Applied(n int) { c.w[ctlEventsApplied].Add(uint64(n)) }

// Room is the pages the agent may still install.
func (c *Ctl) Room() int64 { return int64(c.w[ctlRoom].Load()) }

// AddRoom lets the agent install n more pages.
func (c *Ctl) AddRoom(n int64) { c.w[ctlRoom].Add(uint64(n)) }

// TakeRoom takes back up to n pages of the agent's room and returns how many it took.
func (c *Ctl) TakeRoom(n int64) int64 {
	for {
		r := c.w[ctlRoom].Load()
		k := min(int64(r), n)
		if k <= 0 {
			return 0
		}
		if c.w[ctlRoom].CompareAndSwap(r, r-uint64(k)) {
			return k
		}
	}
}

// Pending reports whether a post is waiting to be read.
func (c *Ctl) Pending() bool { return c.w[ctlPostHead].Load() != c.w[ctlPostTail].Load() }

// Drain reads every post written so far, in order, calling f for each: the page the agent
// installed, how (Post*), the word it claimed, and the thread whose fault it was. It stops at
// f's first error.
func (c *Ctl) Drain(f func(page uint64, dirt uint8, word uint64, tid int32) error) error {
	head, tail := c.w[ctlPostHead].Load(), c.w[ctlPostTail].Load()
	for ; head != tail; head++ {
		p := &c.posts[head%Posts]
		pd, w, tid := p[0].Load(), p[1].Load(), p[2].Load()
		if pd == 0 {
			continue // read already, by TakePost
		}
		if err := f(pd&^(1<<pageShift-1), uint8(pd&3), w, int32(tid)); err != nil {
			c.w[ctlPostHead].Store(head + 1)
			return err
		}
	}
	c.w[ctlPostHead].Store(head)
	return nil
}

// TakePost reads the post of page ahead of its turn, if the agent has written it: how the agent
// installed it and the word it claimed. Drain passes it by later. A page has one post at most
// waiting: its word stays Claimed until farmem has read it.
func (c *Ctl) TakePost(page uint64) (dirt uint8, word uint64, ok bool) {
	head, tail := c.w[ctlPostHead].Load(), c.w[ctlPostTail].Load()
	for ; head != tail; head++ {
		p := &c.posts[head%Posts]
		if pd := p[0].Load(); pd != 0 && pd&^(1<<pageShift-1) == page {
			w := p[1].Load()
			p[0].Store(0)
			return uint8(pd & 3), w, true
		}
	}
	return 0, 0, false
}

func (c *Ctl) close() { unix.Munmap(c.mem) }

// FD is the memfd the control page is in (the table's).
func (c *Ctl) FD() int { return c.fd }
