package ctrl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/fabric"
)

// Client talks to a ctrl. Safe for concurrent use. Every error wraps one of the Err* kinds
// (errors.Is); an unreachable ctrl gives an error naming its address.
type Client struct {
	addr  string // as given, for messages
	base  string // http://host:port or https://host:port
	tok   fabric.Token
	hc    *http.Client
	clear error // non-nil: the token must not be sent in clear to this address (why)
}

// NewClient returns a client of the ctrl at addr (host:port, or an http:// or https:// URL).
// With ca (the cluster CA, see `farmem cert`) the ctrl is reached over TLS and its certificate
// must chain to ca; an https:// URL without ca is checked against the system's roots. In clear,
// the client talks only to a loopback address: the token crosses the wire as a bearer credential.
func NewClient(addr string, tok fabric.Token, ca *x509.CertPool) *Client {
	base := strings.TrimRight(addr, "/")
	if !strings.Contains(base, "://") {
		scheme := "http://"
		if ca != nil {
			scheme = "https://"
		}
		base = scheme + base
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS13}
	c := &Client{addr: addr, base: base, tok: tok,
		// A bound on every call even if the caller's context has none: the ctrl answers from
		// memory plus at most one store write, so 15 s means it is gone, not slow.
		hc: &http.Client{Timeout: 15 * time.Second, Transport: tr}}
	if strings.HasPrefix(base, "http://") {
		c.clear = CheckPlaintext(addr)
	}
	return c
}

// CheckPlaintext says why the ctrl at addr may not be reached in clear: it is not on a loopback
// address, so the cluster token would cross a network readable by others.
func CheckPlaintext(addr string) error {
	hostport := addr
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		if u.Scheme == "https" {
			return nil
		}
		hostport = u.Host
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return errorf(ErrBadRequest, "refusing to send the cluster token in clear to the ctrl at %s: reach it over TLS with --ca FILE (the cluster CA, made by farmem cert); only a ctrl on a loopback address is spoken to without TLS", addr)
}

// Addr is the ctrl's address as given.
func (c *Client) Addr() string { return c.addr }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	if c.clear != nil {
		return c.clear
	}
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	// Whether a connection was made tells an unreachable ctrl from one that took the request
	// and did not answer in time: the second is a different problem (a stalled disk under the
	// ctrl's state, say) and the message should not send the operator to check the network.
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("farmem ctrl at %s: %w", c.addr, err)
	}
	req.Header.Set("Authorization", bearerPrefix+string(c.tok))
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is in our message already, as the address
		}
		if connected.Load() {
			return fmt.Errorf("the farmem ctrl at %s took %s and did not answer %s %s: %w", c.addr, time.Since(start).Round(time.Millisecond), method, path, err)
		}
		return fmt.Errorf("cannot reach the farmem ctrl at %s: %w", c.addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("farmem ctrl at %s: reading the reply to %s %s: %w", c.addr, method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		json.Unmarshal(b, &eb)
		msg := eb.Error
		switch {
		case resp.StatusCode == http.StatusUnauthorized && msg == "":
			msg = UnauthorizedMsg
		case resp.StatusCode == http.StatusBadRequest && bytes.Contains(b, []byte("HTTP request to an HTTPS server")):
			msg = "it serves TLS: give --ca FILE (the cluster CA, from farmem cert)"
		case msg == "":
			msg = fmt.Sprintf("%s %s: HTTP %s (is %s a farmem ctrl?)", method, path, resp.Status, c.addr)
		}
		return &Error{Kind: kindOfStatus(resp.StatusCode), Msg: fmt.Sprintf("farmem ctrl at %s: %s", c.addr, msg)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("farmem ctrl at %s: the reply to %s %s is not the expected JSON (is it a farmem ctrl?): %w", c.addr, method, path, err)
		}
	}
	return nil
}

// ServerHeartbeat reports a memory server's state; the reply says what to free and when to
// report next. ErrGone: the ctrl declared this server instance dead.
func (c *Client) ServerHeartbeat(ctx context.Context, r ServerReport) (HeartbeatReply, error) {
	if r.Slabs == nil {
		r.Slabs = []uint64{}
	}
	var out HeartbeatReply
	err := c.do(ctx, "POST", "/v1/servers/heartbeat", r, &out)
	return out, err
}

// OpenSession starts a client session; name is for people (host, pid, program).
func (c *Client) OpenSession(ctx context.Context, name string) (Session, error) {
	var out Session
	err := c.do(ctx, "POST", "/v1/sessions", map[string]string{"name": name}, &out)
	return out, err
}

// SessionHeartbeat keeps the session open and returns its generation: when it moves, refetch
// the slab map with Slabs. ErrNotFound: the session expired or was closed.
func (c *Client) SessionHeartbeat(ctx context.Context, id fabric.SessionID) (uint64, error) {
	var out struct {
		Generation uint64 `json:"generation"`
	}
	err := c.do(ctx, "POST", "/v1/sessions/"+id.String()+"/heartbeat", nil, &out)
	return out.Generation, err
}

// AllocSlab places a new slab on `replicas` distinct servers. ErrNoRoom: not enough live
// servers with free memory (the message says what there is).
func (c *Client) AllocSlab(ctx context.Context, id fabric.SessionID, replicas int) (Slab, error) {
	var out Slab
	err := c.do(ctx, "POST", "/v1/sessions/"+id.String()+"/slabs", map[string]int{"replicas": replicas}, &out)
	return out, err
}

// Slabs returns the session's generation and slab map.
func (c *Client) Slabs(ctx context.Context, id fabric.SessionID) (uint64, []Slab, error) {
	var out SlabMap
	err := c.do(ctx, "GET", "/v1/sessions/"+id.String()+"/slabs", nil, &out)
	return out.Generation, out.Slabs, err
}

// ReplicaReady says the rebuilding replica of slab on server has been filled from a ready one.
func (c *Client) ReplicaReady(ctx context.Context, id fabric.SessionID, slab uint64, server string) error {
	return c.do(ctx, "POST", "/v1/sessions/"+id.String()+"/slabs/"+strconv.FormatUint(slab, 10)+"/ready", map[string]string{"server": server}, nil)
}

// FreeSlab releases a slab; its servers free it after their next heartbeat.
func (c *Client) FreeSlab(ctx context.Context, id fabric.SessionID, slab uint64) error {
	return c.do(ctx, "DELETE", "/v1/sessions/"+id.String()+"/slabs/"+strconv.FormatUint(slab, 10), nil, nil)
}

// CloseSession ends the session cleanly, releasing all its slabs.
func (c *Client) CloseSession(ctx context.Context, id fabric.SessionID) error {
	return c.do(ctx, "DELETE", "/v1/sessions/"+id.String(), nil, nil)
}

// Status returns the cluster's servers, sessions and totals.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var out Status
	err := c.do(ctx, "GET", "/v1/status", nil, &out)
	return out, err
}
