package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"
)

// The hidden --inject enters a dynamic program as a static one is entered: by injection, with no
// shim preloaded. The program itself says which path served it (whether the shim is among its
// mappings), and its data must come back intact through the cap either way.
func TestInjectFlagOnDynamicProgram(t *testing.T) {
	py := need(t, "/usr/bin/python3")
	script := `import hashlib
shim = any("libfarmem" in l for l in open("/proc/self/maps"))
b = bytearray(range(256)) * (96 << 12)
print("shim" if shim else "no shim", hashlib.sha256(b).hexdigest())`
	sum := sha256.Sum256(bytes.Repeat(func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}(), 96<<12))
	want := "no shim " + hex.EncodeToString(sum[:]) + "\n"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--inject"}, want},
		{nil, "shim " + strings.TrimPrefix(want, "no shim ")},
	} {
		args := append([]string{"run", "--quiet", "--local-mem", "32MiB"}, c.args...)
		args = append(args, "--", py, "-c", script)
		out, err := exec.Command(farmemBin(t), args...).Output()
		if err != nil {
			t.Fatalf("farmem %v: %v", c.args, err)
		}
		if string(out) != c.want {
			t.Errorf("farmem %v printed %q, want %q", c.args, out, c.want)
		}
	}
}
