package fabric

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGrantSignedAndTamperProof(t *testing.T) {
	tok := Token("0123456789abcdef0123")
	g := Grant{Slab: 7, Session: NewSessionID(), Server: "srv-a", Pages: 16384}
	tok.Sign(&g)
	if !tok.Valid(&g) {
		t.Fatal("a freshly signed grant is not valid")
	}
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	var back Grant
	if err := json.Unmarshal(b, &back); err != nil || !tok.Valid(&back) {
		t.Fatalf("grant did not survive JSON: %v %s", err, b)
	}
	for name, mut := range map[string]func(*Grant){
		"slab":    func(g *Grant) { g.Slab++ },
		"pages":   func(g *Grant) { g.Pages *= 2 },
		"session": func(g *Grant) { g.Session[0] ^= 1 },
		"server":  func(g *Grant) { g.Server = "srv-b" },
	} {
		c := g
		mut(&c)
		if tok.Valid(&c) {
			t.Errorf("grant with a changed %s is still valid", name)
		}
	}
	if Token("another-token-of-16+").Valid(&g) {
		t.Error("grant valid under another token")
	}
}

func TestLoadTokenErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("  00112233445566778899aabbccddeeff\n"), 0o600)
	for _, c := range []struct{ path, want string }{
		{"", "--token-file"},
		{filepath.Join(dir, "missing"), "no such file"},
		{short, "at least 16"},
	} {
		if _, err := LoadToken(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("LoadToken(%q) = %v, want an error saying %q", c.path, err, c.want)
		}
	}
	tok, err := LoadToken(good)
	if err != nil || string(tok) != "00112233445566778899aabbccddeeff" {
		t.Fatalf("LoadToken(good) = %q, %v", tok, err)
	}
}
