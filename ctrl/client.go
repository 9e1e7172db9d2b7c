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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/fabric"
)

// Client talks to a ctrl, or to one of several: given a list, it keeps to the one that
// answered last, moves to the next when that one cannot be reached, and to the leader when a
// follower names it (ErrNotLeader). Safe for concurrent use. Every error wraps one of the Err*
// kinds (errors.Is); an unreachable ctrl gives an error naming its address.
type Client struct {
	addrs  []string // as given, in order
	tok    fabric.Token
	hc     *http.Client
	scheme string // "https://" with a CA, else "http://" (for addresses given without one)
	clear  error  // non-nil: the token must not be sent in clear to these addresses (why)

	mu  sync.Mutex
	cur string // guarded by mu: the ctrl requests go to first
}

// NewClient returns a client of the ctrl at addr (host:port, or an http:// or https:// URL), or
// of several ctrls given as a comma-separated list of them. With ca (the cluster CA, see
// `farmem cert`) the ctrl is reached over TLS and its certificate must chain to ca; an https://
// URL without ca is checked against the system's roots. In clear, the client talks only to a
// loopback address: the token crosses the wire as a bearer credential.
func NewClient(addr string, tok fabric.Token, ca *x509.CertPool) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS13}
	c := &Client{addrs: splitAddrs(addr), tok: tok, scheme: "http://",
		// A bound on every call even if the caller's context has none: the ctrl answers from
		// memory plus at most one store write, so 15 s means it is gone, not slow.
		hc: &http.Client{Timeout: 15 * time.Second, Transport: tr}}
	if ca != nil {
		c.scheme = "https://"
	} else {
		c.clear = CheckPlaintext(addr)
	}
	c.cur = c.addrs[0]
	return c
}

// splitAddrs is a comma-separated list of addresses, spaces and empty entries dropped.
func splitAddrs(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return []string{""} // an empty address: the request fails naming it
	}
	return out
}

// CheckPlaintext says why the ctrl at addr (or one of a comma-separated list) may not be
// reached in clear: it is not on a loopback address, so the cluster token would cross a network
// readable by others.
func CheckPlaintext(addr string) error {
	for _, a := range splitAddrs(addr) {
		hostport := a
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			if u.Scheme == "https" {
				continue
			}
			hostport = u.Host
		}
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			host = hostport
		}
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			continue
		}
		return errorf(ErrBadRequest, "refusing to send the cluster token in clear to the ctrl at %s: reach it over TLS with --ca FILE (the cluster CA, made by farmem cert); only a ctrl on a loopback address is spoken to without TLS", a)
	}
	return nil
}

// Addr is the address of the ctrl the client talks to now.
func (c *Client) Addr() string { c.mu.Lock(); defer c.mu.Unlock(); return c.cur }

func (c *Client) url(addr, path string) string {
	base := strings.TrimRight(addr, "/")
	if !strings.Contains(base, "://") {
		base = c.scheme + base
	}
	return base + path
}

// failover is how long a call keeps looking for a ctrl that decides — while the ctrls elect a
// new leader after the old one stopped, say — before it gives up: the leader's lease, and a
// little more.
const failover = DefaultLeaseTTL + 5*time.Second

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
	addr := c.Addr()
	deadline := time.Now().Add(failover)
	var lastErr error
	unreachable := map[string]bool{} // the ctrls of the list not reached since one was
	for attempt := 0; ; attempt++ {
		if len(unreachable) == len(c.addrs) {
			// No ctrl is there to elect a leader: waiting would not help.
			return fmt.Errorf("cannot reach any of the farmem ctrls %s: %w", strings.Join(c.addrs, ", "), lastErr)
		}
		if attempt > len(c.addrs) {
			// Every ctrl tried: wait for an election to finish, within the call's bounds.
			if time.Now().After(deadline) {
				return lastErr
			}
			select {
			case <-ctx.Done():
				return lastErr
			case <-time.After(200 * time.Millisecond):
			}
		}
		err, connected := c.doOne(ctx, addr, method, path, body, out)
		if connected {
			clear(unreachable)
		} else if slices.Contains(c.addrs, addr) {
			unreachable[addr] = true
		}
		var e *Error
		notLeader := errors.As(err, &e) && errors.Is(err, ErrNotLeader)
		switch {
		case err == nil:
			c.mu.Lock()
			c.cur = addr
			c.mu.Unlock()
			return nil
		case notLeader && e.Leader != "" && e.Leader != addr:
			// Told by name: go there (in clear only to loopback, as for any address).
			if c.scheme == "http://" && CheckPlaintext(e.Leader) != nil {
				return err
			}
			lastErr, addr = err, e.Leader
		case notLeader, !connected && len(c.addrs) > 1:
			// No leader yet, or this ctrl is gone: the next one in the list. A request that
			// reached a ctrl and got no answer is not retried: it may have been carried out.
			i := slices.Index(c.addrs, addr)
			lastErr, addr = err, c.addrs[(i+1)%len(c.addrs)]
		default:
			return err
		}
	}
}

// doOne sends one request to the ctrl at addr; connected says whether it was reached.
func (c *Client) doOne(ctx context.Context, addr, method, path string, body []byte, out any) (err error, connected bool) {
	// Whether a connection was made tells an unreachable ctrl from one that took the request
	// and did not answer in time: the second is a different problem (a stalled disk under the
	// ctrl's state, say) and the message should not send the operator to check the network.
	var conn atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { conn.Store(true) }})
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, method, c.url(addr, path), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("farmem ctrl at %s: %w", addr, err), false
	}
	req.Header.Set("Authorization", bearerPrefix+string(c.tok))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is in our message already, as the address
		}
		if conn.Load() {
			return fmt.Errorf("the farmem ctrl at %s took %s and did not answer %s %s: %w", addr, time.Since(start).Round(time.Millisecond), method, path, err), true
		}
		return fmt.Errorf("cannot reach the farmem ctrl at %s: %w", addr, err), false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("farmem ctrl at %s: reading the reply to %s %s: %w", addr, method, path, err), true
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
			msg = fmt.Sprintf("%s %s: HTTP %s (is %s a farmem ctrl?)", method, path, resp.Status, addr)
		}
		return &Error{Kind: kindOfStatus(resp.StatusCode), Msg: fmt.Sprintf("farmem ctrl at %s: %s", addr, msg), Leader: eb.Leader}, true
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("farmem ctrl at %s: the reply to %s %s is not the expected JSON (is it a farmem ctrl?): %w", addr, method, path, err), true
		}
	}
	return nil, true
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

// ReplicasBad reports copies of the session's slabs that a write to, or their creation, failed
// while the program runs: the ctrl drops them and places replacements (the slab map's
// generation moves), which the client fills from a good copy as after a server's death.
// Repeating it is harmless. kept: the copies the ctrl kept, each its slab's last ready one.
func (c *Client) ReplicasBad(ctx context.Context, id fabric.SessionID, bad []BadReplica) (kept []BadReplica, err error) {
	var out BadReply
	err = c.do(ctx, "POST", "/v1/sessions/"+id.String()+"/bad", map[string][]BadReplica{"replicas": bad}, &out)
	return out.Kept, err
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
