package runtime

import (
	"testing"

	"github.com/farmem/farmem/procfs"
)

func TestRegistrable(t *testing.T) {
	for _, c := range []struct {
		line string
		ok   bool
	}{
		{"7f12a8000000-7f12a8021000 rw-p 00000000 00:00 0 ", true},
		{"7f12a8021000-7f12ac000000 ---p 00000000 00:00 0 ", true}, // a glibc arena's reservation
		{"561206ddf000-561206e00000 rw-p 00000000 00:00 0                          [heap]", true},
		{"7f12a8000000-7f12a8001000 rw-p 00000000 00:00 0 ", false}, // under MinRegister
		{"7ffd1c2a0000-7ffd1c2c1000 rw-p 00000000 00:00 0                          [stack]", false},
		{"7f12b9000000-7f12b9021000 rw-s 00000000 00:01 1234                       /dev/zero (deleted)", false},
		{"7f12b9e00000-7f12b9e22000 r--p 00000000 08:01 4242                       /usr/lib/libc.so.6", false},
		{"7f12b9fd0000-7f12b9ff4000 rw-p 001d0000 08:01 4242                       /usr/lib/libc.so.6", false},
		{"7f12ba000000-7f12ba021000 r--p 00000000 00:00 0 ", false},
		{"7f12ba000000-7f12ba021000 rw-p 00000000 00:00 0                          [anon:named]", false},
	} {
		m, ok := procfs.ParseMapsLine(c.line)
		if !ok {
			t.Fatalf("ParseMapsLine(%q) failed", c.line)
		}
		if got := registrable(m, DefaultMinRegister); got != c.ok {
			t.Errorf("registrable(%q) = %v, want %v", c.line, got, c.ok)
		}
	}
}
