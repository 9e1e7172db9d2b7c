package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// writeOnceProg writes every page of 48 MiB once, then hashes all of it four times: after the
// first write, its pages are only read.
const writeOnceProg = `
import hashlib
a = bytearray(48 << 20)
for i in range(0, len(a), 4096):
    a[i:i+8] = i.to_bytes(8, "little")
for r in range(4):
    print("sha256", hashlib.sha256(a).hexdigest(), flush=True)
`

// A page written once and then only read must stop being written out at every eviction: the
// fetcher installs a page seen written in its last stay writable, on a guess, and a stay on
// that guess sees no write, so the next one must be write-protected again and, if still only
// read, dropped clean. (The guess once fed itself: every page ever written was rewritten at
// every eviction for good, 0 dropped clean on redis's read-mostly ETC mix.) The data must come
// back right throughout.
func TestReadOnlyPagesDroppedClean(t *testing.T) {
	py := need(t, "python3")
	script := filepath.Join(t.TempDir(), "writeonce.py")
	if err := os.WriteFile(script, []byte(writeOnceProg), 0o644); err != nil {
		t.Fatal(err)
	}
	args, summary := summarized(t, []string{"run", "--local-mem", "16MiB", "--", py, script})
	out, err := exec.Command(farmemBin(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("farmem run: %v\n%s", err, out)
	}
	buf := make([]byte, 48<<20)
	for i := 0; i < len(buf); i += 4096 {
		binary.LittleEndian.PutUint64(buf[i:], uint64(i))
	}
	sum := sha256.Sum256(buf)
	want := "sha256 " + hex.EncodeToString(sum[:])
	if n := strings.Count(string(out), want); n != 4 {
		t.Fatalf("%d of 4 hashes right (want %s):\n%s", n, want, out)
	}
	e := summary().Evicted
	// Each of the last three passes evicts most of the 12288 pages again; one whole footprint
	// dropped clean is well below what they give, and far above the 0 of a guess that feeds itself.
	if e.DroppedClean < 12288 {
		t.Errorf("%d pages dropped clean, want at least 12288 (48 MiB read three times at a 16 MiB cap):\n%s", e.DroppedClean, out)
	}
	t.Logf("evicted: written %d, dropped clean %d", e.Written, e.DroppedClean)
}
