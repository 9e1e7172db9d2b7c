package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A served program that execs a static binary (which cannot load the shim): the new image runs
// without farmem, and farmem says so, naming it, instead of keeping the old image in the run.
func TestExecedStaticImageIsNamed(t *testing.T) {
	gofmt := filepath.Join(os.Getenv("GOROOT"), "bin", "gofmt")
	if p, err := exec.LookPath("go"); err == nil && os.Getenv("GOROOT") == "" {
		gofmt = filepath.Join(filepath.Dir(p), "gofmt") // the Go distribution's: statically linked
	}
	if _, err := os.Stat(gofmt); err != nil {
		t.Skipf("no gofmt beside the go command: %v", err)
	}
	sum := filepath.Join(t.TempDir(), "summary.json")
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "32MiB", "--summary-json", sum, "--", "/bin/sh", "-c", "exec "+gofmt)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// gofmt reads its stdin to the end: it lives, exec'd, for as long as the pipe stays open.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "did not load farmem's shim") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	in.Write([]byte("package p\nfunc  f( ) {}\n"))
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("farmem run: %v\n%s", err, stderr.String())
	}
	if got, want := stdout.String(), "package p\n\nfunc f() {}\n"; got != want {
		t.Errorf("gofmt printed %q, want %q", got, want)
	}
	if !strings.Contains(stderr.String(), "exec'd "+gofmt+", which did not load farmem's shim") {
		t.Errorf("farmem did not name the unserved image:\n%s", stderr.String())
	}
	var s struct {
		UnservedImages int64 `json:"unserved_images"`
	}
	b, err := os.ReadFile(sum)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil || s.UnservedImages != 1 {
		t.Errorf("summary: unserved_images %d (%v), want 1", s.UnservedImages, err)
	}
}
