package ctrl

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/farmem/farmem/fabric"
)

// AuthHeader carries a request's proof that its sender holds the cluster token:
//
//	Farmem-Auth: <unix-nanos>.<hex of token.MAC("http", method, path, unix-nanos, sha256(body))>
//
// The MAC binds the method, the path and the body, so a captured request cannot be turned into
// another one, and the timestamp bounds how long it can be replayed: the ctrl accepts it within
// MaxClockSkew of its own clock. Inside that window a captured request CAN be replayed as is
// (there is no nonce cache). The requests are idempotent or nearly so — a replayed heartbeat
// repeats a heartbeat; a replayed slab allocation leaks one slab until its session ends — and
// the token already lets its holder do all of it, so the window is accepted. The token itself
// never crosses the wire; confidentiality of the API is not attempted (use a private network).
const AuthHeader = "Farmem-Auth"

func authMAC(tok fabric.Token, method, path, stamp string, body []byte) [32]byte {
	sum := sha256.Sum256(body)
	return tok.MAC([]byte("http"), []byte(method), []byte(path), []byte(stamp), sum[:])
}

// signRequest returns the AuthHeader value for a request sent at now.
func signRequest(tok fabric.Token, method, path string, body []byte, now time.Time) string {
	stamp := strconv.FormatInt(now.UnixNano(), 10)
	mac := authMAC(tok, method, path, stamp, body)
	return stamp + "." + hex.EncodeToString(mac[:])
}

// checkRequest verifies an AuthHeader value. The reason is for the ctrl's log and the 401's
// message: a person fixing the setup needs to know a clock from a token.
func checkRequest(tok fabric.Token, header, method, path string, body []byte, now time.Time) (ok bool, reason string) {
	if header == "" {
		return false, UnauthorizedMsg + " (the request has no " + AuthHeader + " header)"
	}
	stamp, macHex, found := strings.Cut(header, ".")
	nanos, err := strconv.ParseInt(stamp, 10, 64)
	var mac [32]byte
	if !found || err != nil || len(macHex) != hex.EncodedLen(len(mac)) {
		return false, UnauthorizedMsg + " (malformed " + AuthHeader + " header)"
	}
	if _, err := hex.Decode(mac[:], []byte(macHex)); err != nil {
		return false, UnauthorizedMsg + " (malformed " + AuthHeader + " header)"
	}
	if !tok.Verify(mac, []byte("http"), []byte(method), []byte(path), []byte(stamp), shaSum(body)) {
		return false, UnauthorizedMsg
	}
	// Checked after the MAC, so that an unauthenticated sender learns nothing of our clock.
	if skew := now.Sub(time.Unix(0, nanos)); skew > MaxClockSkew || skew < -MaxClockSkew {
		return false, "request timestamp is " + skew.Round(time.Second).String() + " off the ctrl's clock (more than " + MaxClockSkew.String() + "): synchronize the clocks (NTP)"
	}
	return true, ""
}

func shaSum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
