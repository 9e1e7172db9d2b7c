//go:build race

package backend

// raceEnabled: the race detector makes sync.Pool drop items at random, so code that reuses
// pooled buffers (the zstd decoder does) allocates under it even in steady state.
const raceEnabled = true
