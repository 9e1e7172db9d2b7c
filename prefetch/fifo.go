package prefetch

// FIFO is the prefetch cache's replacement policy, Leap's: a fixed number of buffers holding
// keys in the order they came; a hit takes its key out at once wherever it is (eager
// eviction), and a key that finds every buffer full pushes out the oldest. It decides which
// buffer a key goes to and nothing else: the live cache (fetcher.PrefetchCache) and the
// Replayer keep what a buffer holds in arrays of their own, indexed alike. Every operation is
// O(1): the full buffers are linked oldest first, the empty ones kept on a free list.
type FIFO[K comparable] struct {
	keys       []K
	prev, next []int32 // the links of full buffers: prev is older; -1 at either end
	head, tail int32   // oldest and newest full buffer; -1 when empty
	free       []int32 // empty buffers, taken from the end
	index      map[K]int32
}

// NewFIFO returns an empty FIFO of n buffers.
func NewFIFO[K comparable](n int) *FIFO[K] {
	f := &FIFO[K]{keys: make([]K, n), prev: make([]int32, n), next: make([]int32, n), head: -1, tail: -1,
		free: make([]int32, n), index: make(map[K]int32, n)}
	for i := range f.free {
		f.free[i] = int32(n - 1 - i) // buffer 0 is used first
	}
	return f
}

// Cap is the number of buffers; Len the number full.
func (f *FIFO[K]) Cap() int { return len(f.keys) }
func (f *FIFO[K]) Len() int { return len(f.index) }

// Lookup returns the buffer holding k.
func (f *FIFO[K]) Lookup(k K) (int, bool) {
	i, ok := f.index[k]
	return int(i), ok
}

// Insert puts k, which must not be held, in an empty buffer and returns it; if there was none,
// the oldest key was pushed out first (pushed, and its buffer is the one returned).
func (f *FIFO[K]) Insert(k K) (buf int, pushed bool) {
	if len(f.free) == 0 {
		f.Remove(int(f.head))
		pushed = true
	}
	i := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	f.keys[i], f.prev[i], f.next[i] = k, f.tail, -1
	if f.tail >= 0 {
		f.next[f.tail] = i
	} else {
		f.head = i
	}
	f.tail = i
	f.index[k] = i
	return int(i), pushed
}

// Remove empties buffer i, which must be full.
func (f *FIFO[K]) Remove(i int) {
	b := int32(i)
	if p := f.prev[b]; p >= 0 {
		f.next[p] = f.next[b]
	} else {
		f.head = f.next[b]
	}
	if n := f.next[b]; n >= 0 {
		f.prev[n] = f.prev[b]
	} else {
		f.tail = f.prev[b]
	}
	delete(f.index, f.keys[b])
	var zero K
	f.keys[b] = zero
	f.free = append(f.free, b)
}

// RemoveIf empties every buffer whose key satisfies drop.
func (f *FIFO[K]) RemoveIf(drop func(K) bool) {
	for k, i := range f.index {
		if drop(k) {
			f.Remove(int(i))
		}
	}
}
