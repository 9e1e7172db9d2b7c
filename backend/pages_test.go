package backend

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
)

// Test pages shaped like what a program evicts. All-zero pages are left out: page tables never
// hand those to a backend.

// randomPage is incompressible: compressed or encrypted data, hashes, random keys.
func randomPage(r *rand.Rand) []byte {
	p := make([]byte, PageSize)
	for i := 0; i < PageSize; i += 8 {
		binary.LittleEndian.PutUint64(p[i:], r.Uint64())
	}
	return p
}

var words = strings.Fields(`the of and to in is for on that by this with from user id name
	value key error request response status time count ok GET POST /api/v1/items "type":
	"id": null true false 200 404 session token cache hit miss redis set get expire`)

// textPage is log lines or JSON: words from a small vocabulary and numbers.
func textPage(r *rand.Rand) []byte {
	var b strings.Builder
	for b.Len() < PageSize {
		switch r.IntN(8) {
		case 0:
			b.WriteString("\n2025-01-17T10:42:")
			b.WriteString(string(rune('0' + r.IntN(6))))
		case 1:
			b.WriteString(" ")
			b.WriteString(strings.Repeat("9", 1+r.IntN(3)))
		default:
			b.WriteString(" ")
			b.WriteString(words[r.IntN(len(words))])
		}
	}
	return []byte(b.String()[:PageSize])
}

// sparsePage is mostly zeros with a few words set: a fresh heap page with a header or two.
func sparsePage(r *rand.Rand) []byte {
	p := make([]byte, PageSize)
	for range 4 + r.IntN(12) {
		binary.LittleEndian.PutUint64(p[r.IntN(PageSize/8)*8:], r.Uint64())
	}
	return p
}

// patternPage repeats one 8-byte word: an array filled with one value.
func patternPage(r *rand.Rand) []byte {
	p := make([]byte, PageSize)
	w := r.Uint64()
	for i := 0; i < PageSize; i += 8 {
		binary.LittleEndian.PutUint64(p[i:], w)
	}
	return p
}

// heapPage is an array of 32-byte records: two pointers into one heap, a small counter and a
// random hash — typical Go or C heap objects.
func heapPage(r *rand.Rand) []byte {
	p := make([]byte, PageSize)
	base := uint64(0x7f3a_0000_0000) + r.Uint64N(1<<32)&^7
	for i := 0; i < PageSize; i += 32 {
		binary.LittleEndian.PutUint64(p[i:], base+r.Uint64N(1<<20)&^7)
		binary.LittleEndian.PutUint64(p[i+8:], base+r.Uint64N(1<<20)&^7)
		binary.LittleEndian.PutUint64(p[i+16:], r.Uint64N(1000))
		binary.LittleEndian.PutUint64(p[i+24:], r.Uint64())
	}
	return p
}

// mixedPages returns n pages in a fixed mix: a quarter each random, text and heap records, an
// eighth each sparse and pattern. Deterministic, so runs compare.
func mixedPages(n int) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	gens := []func(*rand.Rand) []byte{randomPage, randomPage, textPage, textPage, heapPage, heapPage, sparsePage, patternPage}
	pages := make([][]byte, n)
	for i := range pages {
		pages[i] = gens[i%len(gens)](r)
	}
	return pages
}
