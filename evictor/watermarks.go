package evictor

import "sync/atomic"

// watermarks decides when eviction starts and where it stops, from the cap, the room the
// evictor keeps below it (the head) and the reserve it is told. It does no I/O and keeps no
// clock: the head changes only when grow is called after a fault waited.
//
// Eviction starts head/2 below the cap (High) and a round stops head below it (Low): the room
// between High and the cap absorbs the faults that come while a batch is in flight. What that
// room must hold is the fault rate times a batch's time, which does not grow with the cap, so
// the head grows to two batches at most (maxHead; 1/16 of a small cap, at least minHead
// pages): results/eviction.md, "Headroom: two batches, not 1/16 of the cap".
//
// The head starts at minHead, not at maxHead. Every page of headroom is one that a program
// whose footprint is just under its cap cannot keep, and a loop over such a footprint misses on
// every page once any of it is evicted. Only a program that pages steadily needs the room, and
// it shows it: its faults wait at the cap. So each round that finds a fault waited since the
// last doubles the head, up to maxHead (results/eviction.md, "Room below the cap: start
// small", for both sides of that trade).
//
// The fault path calls waited, lock-free; the evictor goroutine calls grow; anyone reads the
// watermarks.
type watermarks struct {
	capPages int64        // the cap, in pages
	maxHead  int64        // the most room a round leaves below the cap
	head     atomic.Int64 // the room kept now: minHead up to maxHead; written by grow only
	wait     atomic.Bool  // a fault waited at the cap since grow last looked
}

// minHead is the room a run starts with, in pages.
const minHead = 64

// GrownHead is the most room a round leaves below a cap of capPages once the head has grown:
// two batches, or a 16th of a small cap, and at least minHead. farmem sim replays with it.
func GrownHead(capPages int64) int64 { return max(minHead, min(capPages/16, 2*BatchPages)) }

// init sizes the watermarks for a cap of capPages.
func (w *watermarks) init(capPages int64) {
	w.capPages = capPages
	w.maxHead = GrownHead(capPages)
	w.head.Store(minHead)
	w.wait.Store(false)
}

// waited records that a fault had to wait at the cap for room.
func (w *watermarks) waited() { w.wait.Store(true) }

// grow doubles the head, up to maxHead, if a fault waited since the last call.
func (w *watermarks) grow() {
	if w.wait.Swap(false) {
		w.head.Store(min(2*w.head.Load(), w.maxHead))
	}
}

// high is where eviction starts: half the head below the cap, less reserve.
func (w *watermarks) high(reserve int64) int64 { return w.capPages - w.head.Load()/2 - reserve }

// low is where a round of eviction stops: the head below the cap, less reserve.
func (w *watermarks) low(reserve int64) int64 { return w.capPages - w.head.Load() - reserve }

// limit is what the pages counted against the cap may reach before faults wait: the cap less
// reserve.
func (w *watermarks) limit(reserve int64) int64 { return w.capPages - reserve }
