package main

import (
	"bufio"
	"fmt"
	"os"
)

// The generated inputs: deterministic (a fixed-seed generator of our own), so every run of
// every machine reads the same bytes.

type lcg uint64

func (x *lcg) next(n int) int {
	*x = *x*6364136223846793005 + 1442695040888963407
	return int(uint64(*x>>33) % uint64(n))
}

var words = []string{"memory", "page", "fault", "cap", "evict", "store", "kernel", "swap", "far", "near",
	"the", "of", "a", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are", "with", "as",
	"program", "process", "thread", "runtime", "backend", "prefetch", "queue", "batch", "victim", "zram"}

// writeText writes about size bytes of word salad with numbers: compressible, but not trivially.
func writeText(path string, size int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	x := lcg(7)
	n := 0
	for n < size {
		k, err := fmt.Fprintf(w, "%s %s %d %s.\n", words[x.next(len(words))], words[x.next(len(words))], x.next(100000), words[x.next(len(words))])
		if err != nil {
			return err
		}
		n += k
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// writeC writes a C file of n functions, each a few hundred statements of arithmetic over arrays
// and loops, which gcc -O2 optimises for a while.
func writeC(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	x := lcg(11)
	fmt.Fprintln(w, "typedef unsigned long u64;")
	for i := 0; i < n; i++ {
		fmt.Fprintf(w, "u64 f%d(u64 *a, u64 *b, int n) {\n\tu64 s = %d, t = %d;\n", i, x.next(1000), x.next(1000))
		for j := 0; j < 60; j++ {
			switch x.next(4) {
			case 0:
				fmt.Fprintf(w, "\tfor (int i = 0; i < n; i++) { a[i] = a[i] * %d + b[(i + %d) %% n] ^ s; s += a[i] >> %d; }\n", x.next(97)+1, x.next(13), x.next(7)+1)
			case 1:
				fmt.Fprintf(w, "\tif (s %% %d == %d) t += s * %d; else t ^= s + %d;\n", x.next(11)+2, x.next(2), x.next(1000), x.next(1000))
			case 2:
				fmt.Fprintf(w, "\ts = (s << %d) | (t >> %d); t += a[%d %% n] + b[%d %% n];\n", x.next(31)+1, x.next(31)+1, x.next(64), x.next(64))
			default:
				fmt.Fprintf(w, "\tswitch (t & 3) { case 0: s += %d; break; case 1: s *= %d; break; case 2: t -= %d; break; default: t ^= s; }\n", x.next(1000), x.next(1000)+1, x.next(1000))
			}
		}
		fmt.Fprintln(w, "\treturn s ^ t;\n}")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// writeGo writes a Go file of n declarations, laid out badly on purpose (gofmt must reformat
// every line), with composite literals that make a deep syntax tree.
func writeGo(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	x := lcg(13)
	fmt.Fprintln(w, "package big")
	for i := 0; i < n; i++ {
		fmt.Fprintf(w, "var   v%d =   map[string][]int{ \"%s\" :{ %d,%d ,%d}, \"%s\":{%d}   }\n", i,
			words[x.next(len(words))], x.next(1000), x.next(1000), x.next(1000), words[x.next(len(words))], x.next(1000))
		if i%10 == 0 {
			fmt.Fprintf(w, "func   f%d( a  int,b int )int{ if a>b{return a*%d}\n return b+%d }\n", i, x.next(100), x.next(100))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}
