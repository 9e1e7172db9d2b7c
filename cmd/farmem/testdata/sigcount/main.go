// sigcount is the static Go program of the terminal test (cmd/farmem/terminal_test.go), the
// python program's twin: it says whether SIGTTOU is ignored, then counts the SIGINTs it gets and
// says so; SIGTERM makes it say the total and exit.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	status, _ := os.ReadFile("/proc/self/status")
	ttou := "default"
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "SigIgn:" {
			if m, _ := strconv.ParseUint(f[1], 16, 64); m&(1<<(uint(syscall.SIGTTOU)-1)) != 0 {
				ttou = "ignored"
			}
		}
	}
	fmt.Println("SIGTTOU", ttou)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	fmt.Println("ready")
	n := 0
	for s := range sigs {
		if s == syscall.SIGTERM {
			fmt.Println("TERM", n)
			os.Exit(0)
		}
		n++
		fmt.Println("INT", n)
	}
}
