package ctrl

import (
	"crypto/subtle"
	"fmt"
	"strings"

	"github.com/farmem/farmem/fabric"
)

// Every request carries the cluster token as a bearer credential (RFC 6750):
//
//	Authorization: Bearer <the token file's text>
//
// so that any HTTP client speaks the API (curl --cacert ca.pem -H "Authorization: Bearer
// $(cat token)" https://ctrl:7000/v1/status). The token crosses the wire, so the ctrl serves
// it over TLS, and in clear only on a loopback address, where the one who could read it off
// the wire is root on that host, who can read the token file as well. Replay is discussed in
// doc.go.

// bearerPrefix starts the Authorization header's value (the scheme is case-insensitive).
const bearerPrefix = "Bearer "

// checkBearer refuses a token that cannot travel in a header: the token file is text (hex
// from openssl rand, say), and a byte outside printable ASCII would be mangled or refused.
func checkBearer(tok fabric.Token) error {
	for _, b := range tok {
		if b < 0x21 || b > 0x7e {
			return fmt.Errorf("the cluster token holds byte %#02x: it must be printable ASCII without spaces to be sent as a bearer token (make one with: openssl rand -hex 32 > token)", b)
		}
	}
	return nil
}

// checkRequest verifies an Authorization header. The reason is for the ctrl's log and the 401's
// message: a person fixing the setup needs to know a missing header from a wrong token.
func checkRequest(tok fabric.Token, header string) (ok bool, reason string) {
	if header == "" {
		return false, UnauthorizedMsg + " (the request has no Authorization: Bearer header)"
	}
	if len(header) < len(bearerPrefix) || !strings.EqualFold(header[:len(bearerPrefix)], bearerPrefix) {
		return false, UnauthorizedMsg + " (the Authorization header is not \"Bearer TOKEN\")"
	}
	got := strings.TrimSpace(header[len(bearerPrefix):])
	if subtle.ConstantTimeCompare([]byte(got), tok) != 1 {
		return false, UnauthorizedMsg
	}
	return true, ""
}
