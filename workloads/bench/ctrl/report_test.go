package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The section replaces the one a previous run wrote and leaves the rest of the file alone.
func TestWriteReportReplacesItsSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fabric.md")
	before := "# fabric transports vs raw floors\n\nthe transports' tables\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	stacks := []*stack{{name: "file"}, {name: "etcd, 1 member"}}
	rows := []row{{store: "file", kind: "place", us: 2000}, {store: "file", kind: "place", us: 4000}, {store: "file", kind: "place", us: 3000},
		{store: "etcd, 1 member", kind: "place", us: 1000}, {store: "etcd, 1 member", kind: "replace", us: 900000}, {store: "etcd, 1 member", kind: "ready", us: 5000}}
	for range 2 {
		if err := writeReport(path, "fabric-ctrl.csv", stacks, rows); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, before) {
		t.Errorf("the file's own content changed:\n%s", doc)
	}
	if n := strings.Count(doc, beginMark); n != 1 || strings.Count(doc, endMark) != 1 {
		t.Errorf("%d sections after two runs:\n%s", n, doc)
	}
	for _, want := range []string{"| file | 3.00 | 4.00 | 3 |  | 0 |  | 0 |", "| etcd, 1 member | 1.00 | 1.00 | 1 | 900.00 | 1 | 5.00 | 1 |"} {
		if !strings.Contains(doc, want) {
			t.Errorf("no row %q in:\n%s", want, doc)
		}
	}
}
