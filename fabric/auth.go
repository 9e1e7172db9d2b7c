package fabric

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
)

// Token is the cluster's shared secret (--token-file): the same on ctrl, memory servers and
// clients. It never crosses the wire; peers prove they hold it by MACs over fresh nonces.
type Token []byte

// MinTokenBytes is the shortest token accepted: 128 bits.
const MinTokenBytes = 16

// LoadToken reads a token file. Surrounding whitespace is ignored, so `openssl rand -hex 32 >
// token` works as written.
func LoadToken(path string) (Token, error) {
	if path == "" {
		return nil, fmt.Errorf("a cluster token is required: pass --token-file (the same file on ctrl, memory servers and clients; make one with: openssl rand -hex 32 > token)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster token: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinTokenBytes {
		return nil, fmt.Errorf("the cluster token in %s is %d bytes; at least %d are needed (make one with: openssl rand -hex 32 > %s)", path, len(b), MinTokenBytes, path)
	}
	return Token(b), nil
}

// MAC is HMAC-SHA256 under the token over the parts, each length-prefixed so that no two
// different part lists MAC alike.
func (t Token) MAC(parts ...[]byte) [32]byte {
	h := hmac.New(sha256.New, t)
	var n [4]byte
	for _, p := range parts {
		binary.LittleEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Verify reports, in constant time, whether mac is the token's MAC over the parts.
func (t Token) Verify(mac [32]byte, parts ...[]byte) bool {
	want := t.MAC(parts...)
	return hmac.Equal(want[:], mac[:])
}

// SessionID names one client session (one `farmem run`). The ctrl hands it out; it owns the
// session's slabs on every memory server.
type SessionID [16]byte

// NewSessionID returns a random session id.
func NewSessionID() SessionID {
	var s SessionID
	rand.Read(s[:])
	return s
}

func (s SessionID) String() string { return hex.EncodeToString(s[:]) }

// MarshalText implements encoding.TextMarshaler (hex).
func (s SessionID) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *SessionID) UnmarshalText(b []byte) error {
	if hex.DecodedLen(len(b)) != len(s) {
		return fmt.Errorf("fabric: session id %q is not %d hex bytes", b, len(s))
	}
	_, err := hex.Decode(s[:], b)
	return err
}

// Grant is the ctrl's permission for a session to create one slab on one memory server. The
// client presents it to the server, which checks the MAC with the shared token: slabs exist
// only where the ctrl placed them, and belong to the session named in the grant.
type Grant struct {
	Slab    uint64    `json:"slab"`    // cluster-unique slab id, chosen by the ctrl
	Session SessionID `json:"session"` // the owner
	Server  string    `json:"server"`  // the memory server's instance id (a restarted server has a new one)
	Pages   uint32    `json:"pages"`   // slab size in 4 KiB pages
	MAC     MAC       `json:"mac"`
}

// MAC is a 32-byte HMAC, hex in JSON.
type MAC [32]byte

// MarshalText implements encoding.TextMarshaler (hex).
func (m MAC) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(m[:])), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *MAC) UnmarshalText(b []byte) error {
	if hex.DecodedLen(len(b)) != len(m) {
		return fmt.Errorf("fabric: mac is not %d hex bytes", len(m))
	}
	_, err := hex.Decode(m[:], b)
	return err
}

func (g *Grant) macParts() [][]byte {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], g.Slab)
	binary.LittleEndian.PutUint32(b[8:], g.Pages)
	return [][]byte{[]byte("grant"), b[:], g.Session[:], []byte(g.Server)}
}

// Sign sets g.MAC.
func (t Token) Sign(g *Grant) { g.MAC = t.MAC(g.macParts()...) }

// Valid reports whether g was signed with this token.
func (t Token) Valid(g *Grant) bool { return t.Verify(g.MAC, g.macParts()...) }
