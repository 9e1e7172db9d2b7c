// staticfill is the static Go program of the static-binary tests (cmd/farmem/static_test.go):
// it fills MIB mebibytes with a pseudo-random stream, each page starting with its own number,
// rewrites ROUNDS pages at random, checking the number first, and prints a SHA-256 digest of the
// whole, which depends only on its arguments. A page whose number is wrong (zeros where farmem
// lost a page) is reported, exit status 99.
//
//	staticfill MIB ROUNDS
package main

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: staticfill MIB ROUNDS")
		os.Exit(2)
	}
	mib, err1 := strconv.Atoi(os.Args[1])
	rounds, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil || mib <= 0 || rounds < 0 {
		fmt.Fprintln(os.Stderr, "staticfill: MIB and ROUNDS are counts")
		os.Exit(2)
	}
	const page = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	// One slice per MiB: the Go heap grows as the program runs, as a server's does.
	chunks := make([][]byte, mib)
	for i := range chunks {
		c := make([]byte, 1<<20)
		for j := 0; j < len(c); j += 8 {
			v := rng.Uint64()
			for k := 0; k < 8; k++ {
				c[j+k] = byte(v >> (8 * k))
			}
		}
		for j := 0; j < len(c); j += page {
			binary.LittleEndian.PutUint64(c[j:], uint64(i*(1<<20/page)+j/page))
		}
		chunks[i] = c
	}
	pages := mib << 20 / page
	for r := 0; r < rounds; r++ {
		p := rng.IntN(pages)
		c := chunks[p/(1<<20/page)]
		off := p % (1 << 20 / page) * page
		// Read the page and write it back changed: the old contents must have come back right.
		if got := binary.LittleEndian.Uint64(c[off:]); got != uint64(p) {
			fmt.Printf("BAD page %d holds %d\n", p, got)
			os.Exit(99)
		}
		seed := rng.Uint64()
		for k := 8; k < page; k += 8 {
			c[off+k] ^= byte(seed >> (k % 64))
		}
	}
	h := sha256.New()
	for _, c := range chunks {
		h.Write(c)
	}
	fmt.Printf("staticfill %d MiB %d rounds: %x\n", mib, rounds, h.Sum(nil))
}
