package ctrl

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/farmem/farmem/fabric"
)

// The JSON shapes of the API. Every page count is in 4 KiB pages.

// PageSize is the unit of every page count in the API.
const PageSize = 4096

// Timing of the cluster. The intervals are told to servers and clients in every reply, so
// changing them here changes them everywhere.
const (
	ServerInterval        = 500 * time.Millisecond // memory-server heartbeats
	SessionInterval       = time.Second            // client-session heartbeats
	TickInterval          = 100 * time.Millisecond // how often the service advances the state machine
	DefaultDeadAfter      = 2 * time.Second        // a server silent this long is dead
	DefaultSessionTimeout = 15 * time.Second       // a session silent this long has ended
	DefaultDeadRetention  = 24 * time.Hour         // a dead server stays listed this long
	DefaultSlabPages      = 16384                  // 64 MiB slabs
	MaxReplicas           = 8                      // more copies than this is a mistake, not a policy
)

// Replica states.
const (
	Ready      = "ready"      // holds the slab's data (a new slab is ready: all zeros everywhere)
	Rebuilding = "rebuilding" // placed to replace a lost copy; the client fills it from a ready one, then calls ReplicaReady
)

// ServerReport is a memory server's heartbeat (POST /v1/servers/heartbeat).
type ServerReport struct {
	ID            string   `json:"id"`             // random per-process instance id: a restarted server is a new server
	Addr          string   `json:"addr"`           // host:port clients dial
	CapacityPages uint64   `json:"capacity_pages"` // --capacity
	UsedPages     uint64   `json:"used_pages"`     // pages of the slabs it holds
	Slabs         []uint64 `json:"slabs"`          // ids of the slabs it holds
}

// HeartbeatReply tells a memory server when to report next and what to free.
type HeartbeatReply struct {
	IntervalMs int64    `json:"interval_ms"`
	Free       []uint64 `json:"free"` // slabs it holds that the ctrl no longer places there
}

// Interval is IntervalMs as a duration.
func (h HeartbeatReply) Interval() time.Duration {
	return time.Duration(h.IntervalMs) * time.Millisecond
}

// Session is the reply to opening a session (POST /v1/sessions).
type Session struct {
	ID         fabric.SessionID `json:"session"`
	IntervalMs int64            `json:"interval_ms"` // heartbeat at this interval
	SlabPages  uint32           `json:"slab_pages"`  // size of every slab the session allocates
}

// Interval is IntervalMs as a duration.
func (s Session) Interval() time.Duration { return time.Duration(s.IntervalMs) * time.Millisecond }

// Replica is one copy of a slab.
type Replica struct {
	Server string       `json:"server"` // memory server instance id
	Addr   string       `json:"addr"`
	State  string       `json:"state"` // Ready or Rebuilding
	Grant  fabric.Grant `json:"grant"` // the ctrl's permission to create the slab there, for the session
}

// Slab is a slab of a session and where its copies live.
type Slab struct {
	ID       uint64    `json:"slab"`
	Pages    uint32    `json:"pages"`
	Replicas []Replica `json:"replicas"`
	// Lost is set when no ready copy survives: the client must stop the program naming
	// LostServers (the addresses of the dead servers that held it), never serve zeros.
	Lost        bool     `json:"lost"`
	LostServers []string `json:"lost_servers"`
}

// BadReplica names a copy of a slab that a client could not write or create
// (POST /v1/sessions/{id}/bad, {"replicas": [BadReplica...]}).
type BadReplica struct {
	Slab   uint64 `json:"slab"`
	Server string `json:"server"` // memory server instance id
}

// BadReply is the reply to a replica-bad report: the copies the ctrl kept, each its slab's last
// ready copy; every other one named was dropped and replaced (or was gone already).
type BadReply struct {
	Kept []BadReplica `json:"kept"`
}

// SlabMap is the reply to GET /v1/sessions/{id}/slabs.
type SlabMap struct {
	Generation uint64 `json:"generation"`
	Slabs      []Slab `json:"slabs"`
}

// Status is the cluster as `farmem status` shows it (GET /v1/status).
type Status struct {
	Leader    string          `json:"leader,omitempty"` // with several ctrls: the leader's address (it answered)
	SlabPages uint32          `json:"slab_pages"`
	Servers   []ServerStatus  `json:"servers"`
	Sessions  []SessionStatus `json:"sessions"`
	Totals    Totals          `json:"totals"`
}

// ServerStatus is one memory server.
type ServerStatus struct {
	ID               string `json:"id"`
	Addr             string `json:"addr"`
	CapacityPages    uint64 `json:"capacity_pages"`
	UsedPages        uint64 `json:"used_pages"`
	FreePages        uint64 `json:"free_pages"` // what placement sees: capacity − used − granted but not yet reported
	Healthy          bool   `json:"healthy"`
	MsSinceHeartbeat int64  `json:"ms_since_heartbeat"`
	Slabs            int    `json:"slabs"` // replicas the ctrl places there
}

// SessionStatus is one client session.
type SessionStatus struct {
	ID               fabric.SessionID `json:"id"`
	Name             string           `json:"name"`
	Slabs            int              `json:"slabs"`
	Replicas         int              `json:"replicas"`   // copies asked for per slab (the largest if slabs differ)
	Degraded         int              `json:"degraded"`   // slabs with fewer ready copies than asked for
	Rebuilding       int              `json:"rebuilding"` // replicas being refilled
	Lost             int              `json:"lost"`       // slabs with no copy left
	Generation       uint64           `json:"generation"`
	MsSinceHeartbeat int64            `json:"ms_since_heartbeat"`
}

// Totals sums the cluster up.
type Totals struct {
	Servers        int    `json:"servers"`
	HealthyServers int    `json:"healthy_servers"`
	CapacityPages  uint64 `json:"capacity_pages"` // of healthy servers
	UsedPages      uint64 `json:"used_pages"`     // of healthy servers
	Sessions       int    `json:"sessions"`
	Slabs          int    `json:"slabs"`
	Degraded       int    `json:"degraded"`
	Rebuilding     int    `json:"rebuilding"`
	Lost           int    `json:"lost"`
}

// Kinds of error. Errors from the Cluster, the Service and the Client wrap one of these, so
// errors.Is tells a caller what happened whichever side it is on; the message says why.
var (
	ErrBadRequest   = errors.New("bad request")    // 400
	ErrUnauthorized = errors.New("unauthorized")   // 401
	ErrNotFound     = errors.New("not found")      // 404: unknown or ended session, unknown slab
	ErrConflict     = errors.New("conflict")       // 409: e.g. ReplicaReady for a replica no longer placed
	ErrGone         = errors.New("gone")           // 410: a memory server the ctrl declared dead
	ErrNoRoom       = errors.New("no room")        // 503: not enough live servers with free memory
	ErrInternal     = errors.New("internal error") // 500: e.g. the state cannot be written
	ErrNotLeader    = errors.New("not the leader") // 421: one of several ctrls, not the one deciding; the error names the leader
)

// UnauthorizedMsg is what a request without the right token is told.
const UnauthorizedMsg = "wrong or missing cluster token: check --token-file matches the ctrl's"

// Error is an API error: a kind (one of the Err* values) and a message for a person.
type Error struct {
	Kind   error
	Msg    string
	Leader string // with ErrNotLeader: the leading ctrl's address, if one is elected
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, a ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, a...)}
}

var statusOfKind = map[error]int{
	ErrBadRequest:   400,
	ErrUnauthorized: 401,
	ErrNotFound:     404,
	ErrConflict:     409,
	ErrGone:         410,
	ErrInternal:     500,
	ErrNoRoom:       503,
	ErrNotLeader:    421,
}

func httpStatus(err error) int {
	var e *Error
	if errors.As(err, &e) {
		if s, ok := statusOfKind[e.Kind]; ok {
			return s
		}
	}
	return 500
}

func kindOfStatus(code int) error {
	for k, s := range statusOfKind {
		if s == code {
			return k
		}
	}
	if code >= 500 {
		return ErrInternal
	}
	return ErrBadRequest
}

// fmtPages writes a page count as bytes with a binary unit, as the CLI's sizes are written.
func fmtPages(pages uint64) string { return FormatBytes(pages * PageSize) }

// FormatBytes writes n as 64MiB, 1.5GiB, 0B.
func FormatBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == float64(uint64(v)) {
		return fmt.Sprintf("%d%s", uint64(v), units[i])
	}
	// One decimal, more where one would round an inexact value to a whole number: 3.996GiB
	// free is not 4.0GiB free.
	s := fmt.Sprintf("%.1f", v)
	for prec := 2; prec <= 3 && strings.HasSuffix(s, "0"); prec++ {
		s = fmt.Sprintf("%.*f", prec, v)
	}
	return s + units[i]
}
