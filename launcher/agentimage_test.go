package launcher

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The agent make builds is one farmem can map as it is.
func TestAgentImage(t *testing.T) {
	img, err := readAgent(agentELF)
	if err != nil {
		t.Fatalf("the embedded agent: %v", err)
	}
	if img.span > 64<<10 {
		t.Errorf("the agent spans %d KiB: it stays small", img.span>>10)
	}
	for _, s := range img.segs {
		if s.off+uint64(len(s.data)) > img.span || uint64(len(s.data)) > s.memsz {
			t.Errorf("segment at %#x: %d bytes of file, %d in memory, past the span %d", s.off, len(s.data), s.memsz, img.span)
		}
	}
}

// An agent built with a pointer in its data needs a relocation, which nothing would apply: it is
// refused, whatever else it has.
func TestAgentWithRelocationRefused(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc")
	}
	dir := t.TempDir()
	src, out := filepath.Join(dir, "a.c"), filepath.Join(dir, "a.elf")
	os.WriteFile(src, []byte(`
static int x;
int *p = &x; /* an absolute address: R_X86_64_RELATIVE */
struct { char s[108]; int u; unsigned long m, l, st; int lf; } fm_params;
void fm_start_entry(void) { *p = 1; }
void fm_fork_entry(void) {}
`), 0o644)
	b, err := exec.Command(cc, "-Os", "-ffreestanding", "-fPIC", "-nostdlib", "-static-pie",
		"-Wl,--no-dynamic-linker,-e,fm_start_entry", "-o", out, src).CombinedOutput()
	if err != nil {
		t.Fatalf("building the test agent: %v\n%s", err, b)
	}
	elf, _ := os.ReadFile(out)
	if _, err := readAgent(elf); err == nil || !strings.Contains(err.Error(), "relocations") {
		t.Fatalf("an agent with a relocation: %v, want it refused for its relocations", err)
	}
	if _, err := readAgent([]byte("not an ELF file")); err == nil {
		t.Fatal("a file that is no ELF was taken for an agent")
	}
}
