package faulttrace

import "math"

// Misses are a replacement policy's misses over an access stream at a cap: Cold, the first
// access to each page (every policy takes them), and Refaults, the misses on pages seen
// before, which are what a policy can avoid.
type Misses struct {
	Cold     uint64 `json:"cold"`
	Refaults uint64 `json:"refaults"`
}

// LRU replays a through least-recently-used replacement holding at most capPages pages.
func LRU(a *Accesses, capPages int) Misses {
	const none = math.MaxUint32
	n := len(a.Pages)
	prev, next := make([]uint32, n), make([]uint32, n) // the recency list, most recent first
	in, seen := make([]bool, n), make([]bool, n)
	head, tail := uint32(none), uint32(none)
	unlink := func(p uint32) {
		if prev[p] != none {
			next[prev[p]] = next[p]
		} else {
			head = next[p]
		}
		if next[p] != none {
			prev[next[p]] = prev[p]
		} else {
			tail = prev[p]
		}
	}
	pushFront := func(p uint32) {
		prev[p], next[p] = none, head
		if head != none {
			prev[head] = p
		}
		head = p
		if tail == none {
			tail = p
		}
	}
	var m Misses
	resident := 0
	for _, p := range a.Seq {
		if in[p] {
			if head != p {
				unlink(p)
				pushFront(p)
			}
			continue
		}
		if seen[p] {
			m.Refaults++
		} else {
			m.Cold++
			seen[p] = true
		}
		if resident == capPages {
			v := tail
			unlink(v)
			in[v] = false
			resident--
		}
		pushFront(p)
		in[p] = true
		resident++
	}
	return m
}

// MIN replays a through Belady's MIN holding at most capPages pages: on a miss at the cap it
// evicts the resident page whose next use is furthest away (never, first). No policy that must
// bring each accessed page in misses less.
func MIN(a *Accesses, capPages int) Misses {
	n := len(a.Seq)
	never := uint32(n) // past every access
	// nextUse[i]: the index of the next access to a.Seq[i]'s page after i, or never.
	nextUse := make([]uint32, n)
	upcoming := make([]uint32, len(a.Pages))
	for p := range upcoming {
		upcoming[p] = never
	}
	for i := n - 1; i >= 0; i-- {
		p := a.Seq[i]
		nextUse[i] = upcoming[p]
		upcoming[p] = uint32(i)
	}
	// From here upcoming[p] is resident page p's next use. The heap holds a (next use, page)
	// entry for each resident page, the furthest on top, and older entries of pages used
	// since: those no longer equal to their page's upcoming use are stale and skipped. Each
	// access's next use is distinct, so a page's current entry is its only one equal to it. The
	// heap is rebuilt from its current entries when the stale ones pile up.
	in, seen := make([]bool, len(a.Pages)), make([]bool, len(a.Pages))
	var h useHeap
	var m Misses
	resident := 0
	for i, p := range a.Seq {
		if !in[p] {
			if seen[p] {
				m.Refaults++
			} else {
				m.Cold++
				seen[p] = true
			}
			for resident == capPages {
				at, v := h.pop()
				if in[v] && upcoming[v] == at {
					in[v] = false
					resident--
				}
			}
			in[p] = true
			resident++
		}
		upcoming[p] = nextUse[i]
		h.push(nextUse[i], p)
		if len(h) > 4*capPages+1024 {
			h.keep(func(at, page uint32) bool { return in[page] && upcoming[page] == at })
		}
	}
	return m
}

// useHeap is a max-heap of next uses: (at << 32 | page), the furthest use on top.
type useHeap []uint64

func (h *useHeap) push(at, page uint32) {
	*h = append(*h, uint64(at)<<32|uint64(page))
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if s[parent] >= s[i] {
			break
		}
		s[parent], s[i] = s[i], s[parent]
		i = parent
	}
}

func (h *useHeap) pop() (at, page uint32) {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	*h = s
	h.down(0)
	return uint32(top >> 32), uint32(top)
}

func (h useHeap) down(i int) {
	for {
		big, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l] > h[big] {
			big = l
		}
		if r < len(h) && h[r] > h[big] {
			big = r
		}
		if big == i {
			return
		}
		h[i], h[big] = h[big], h[i]
		i = big
	}
}

// keep drops the entries live rejects and restores the heap order.
func (h *useHeap) keep(live func(at, page uint32) bool) {
	kept := (*h)[:0]
	for _, u := range *h {
		if live(uint32(u>>32), uint32(u)) {
			kept = append(kept, u)
		}
	}
	*h = kept
	for i := len(kept)/2 - 1; i >= 0; i-- {
		kept.down(i)
	}
}

// Clock replays a through second-chance FIFO (CLOCK) holding at most capPages pages, each
// resident page with one bit that mark sets: an access sets it when mark(i) says so (the
// faulting access included). At a miss at the cap, pages leave the queue's head in order; one
// with its bit set is passed over instead, its bit cleared, to the tail. With every access
// marking, the bit is the accessed bit a kernel's page tables keep (CLOCK, LRU's usual
// stand-in); with only writes marking, it is the written bit UFFD_FEATURE_WP_ASYNC with
// PAGEMAP_SCAN reports without a fault.
func Clock(a *Accesses, capPages int, mark func(i int) bool) Misses {
	in, seen, bit := make([]bool, len(a.Pages)), make([]bool, len(a.Pages)), make([]bool, len(a.Pages))
	queue := make([]uint32, 0, 2*capPages) // resident pages, oldest first, from head
	head := 0
	var m Misses
	for i, p := range a.Seq {
		if in[p] {
			bit[p] = bit[p] || mark(i)
			continue
		}
		if seen[p] {
			m.Refaults++
		} else {
			m.Cold++
			seen[p] = true
		}
		if len(queue)-head == capPages {
			for {
				v := queue[head]
				head++
				if !bit[v] {
					in[v] = false
					break
				}
				bit[v] = false
				queue = append(queue, v)
			}
			if head > capPages {
				queue = append(queue[:0], queue[head:]...)
				head = 0
			}
		}
		in[p], bit[p] = true, mark(i)
		queue = append(queue, p)
	}
	return m
}
