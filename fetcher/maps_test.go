package fetcher

import "testing"

func TestAnonMapping(t *testing.T) {
	cases := []struct {
		line string
		ok   bool
	}{
		{"7f12a8000000-7f12a8021000 rw-p 00000000 00:00 0 ", true},
		{"7f12a8021000-7f12ac000000 ---p 00000000 00:00 0 ", true}, // a glibc arena's reservation
		{"561206ddf000-561206e00000 rw-p 00000000 00:00 0                          [heap]", true},
		{"7ffd1c2a0000-7ffd1c2c1000 rw-p 00000000 00:00 0                          [stack]", false},
		{"7f12b9000000-7f12b9021000 rw-s 00000000 00:01 1234                       /dev/zero (deleted)", false},
		{"7f12b9e00000-7f12b9e22000 r--p 00000000 08:01 4242                       /usr/lib/libc.so.6", false},
		{"7f12b9fd0000-7f12b9fd4000 rw-p 001d0000 08:01 4242                       /usr/lib/libc.so.6", false},
		{"7f12ba000000-7f12ba001000 r--p 00000000 00:00 0 ", false},
		{"garbage", false},
	}
	for _, c := range cases {
		if _, _, ok := anonMapping(c.line); ok != c.ok {
			t.Errorf("anonMapping(%q) = %v, want %v", c.line, ok, c.ok)
		}
	}
	if s, e, _ := anonMapping(cases[0].line); s != 0x7f12a8000000 || e != 0x7f12a8021000 {
		t.Errorf("range %#x-%#x", s, e)
	}
}
