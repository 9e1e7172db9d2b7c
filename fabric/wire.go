// Package fabric moves 4 KiB pages between a farmem runtime and memory servers: the wire
// protocol, the memory server, and the transports that speak it.
//
// # Protocol (version 2)
//
// Every frame is a 24-byte little-endian header and Len bytes of payload:
//
//	magic u16 | op u8 | status u8 | count u32 | id u64 | len u32 | flags u32
//
// A connection opens with the server's Challenge (its protocol version, a fresh nonce and its
// instance id); the client answers with Hello (its version, its session id and the token's MAC
// over the nonce, session and instance id), and the server accepts or refuses. The token never
// crosses the wire. The header layout and the Challenge payload's first two bytes (the version)
// are fixed forever, so that peers of different versions can always tell each other so.
//
// After the handshake the client sends requests and the server answers each, in order, echoing
// its id: Create (a slab, with the ctrl's signed Grant), Write and Read (count pages named by
// 12-byte addresses: slab u64, page u32; many pages per request, scatter/gather), Free (a slab).
// An error answer carries a status and a message. A malformed frame closes the connection; the
// server never trusts a length it has not bounded.
//
// A session owns the slabs it created; a request naming a slab of another session is answered
// exactly like one naming no slab at all.
//
// # Traced requests (new in version 2)
//
// flags (version 1's reserved word, then always zero) has one bit, FlagTraced, allowed on Read
// and Write requests only: the payload then begins with a 25-byte trace context, the W3C trace
// context of the client span the request is part of (trace id [16]byte, span id [8]byte, trace
// flags u8), before the addresses (and a Write's pages); Len counts it. The server makes a span
// of its own for the request, a child of that remote span, so that one trace shows the client's
// page fault, its backend fetch and the memory server's read (ServerConfig.Trace). Any other
// flag bit, the flag on any other op, on an answer or with a non-OK status, and a context with
// a zero trace or span id are malformed frames.
// A request without the flag is exactly a version 1 request.
//
// Only requests a server serves with its own CPU can be traced: over tcp, Read and Write. The
// shm and rdma transports move pages with no request to the server at all (memcpy into a shared
// mapping, one-sided RDMA), so a fault read through them has no server span.
//
// Why a new version, not a new request within version 1 as Map was: a version 1 server closes
// the connection on any header with flags set, as malformed, and a client could not tell
// beforehand whether its server would. Peers of versions 1 and 2 are refused at the handshake
// instead, by name (run the same farmem version on both).
//
// # Map (the shm transport, same host)
//
// On a unix-socket connection a client may also send Map: payload the slab id (u64); the answer
// carries the slab's size in pages (u32) and, as SCM_RIGHTS ancillary data on the answer, the
// slab's memfd, which the client maps shared and reads and writes with plain loads and stores
// (no server CPU on the data path). Only the session's own slabs are mapped (any other slab is
// refused with StatusNoSlab, like a read); the memfd is sealed against growing and shrinking.
// Map over tcp is a malformed frame (the connection closes). Map was added within version 1.
//
// # RDMA connect and register (the rdma transport)
//
// A client built with the rdma transport (build tag rdma) keeps one tcp connection as its
// control connection: the same handshake, Create and Free as over tcp, plus two requests. The
// pages then move by one-sided RDMA READ and WRITE, with no server CPU on the data path.
//
//   - RDMAConnect: payload the client's queue pair (32 bytes: qpn u32, psn u32, lid u16, mtu u8,
//     rd_atomic u8, gid [16]byte, retire u32). The server creates a reliable-connected queue
//     pair in this connection's protection domain, connects it to the client's and answers with
//     its own in the same layout (retire zero). retire names a server queue pair of this
//     connection that the client gave up (after an error), to destroy first; zero: none. mtu is
//     the sender's port MTU (enum ibv_mtu: 1 = 256 ... 5 = 4096) and rd_atomic the RDMA READs it
//     can have outstanding as initiator (client) or responder (server); each side uses the
//     smaller of the two. At most 64 queue pairs per connection (StatusCapacity beyond).
//   - RDMARegister: payload the slab id (u64). The server registers the slab's memory in this
//     connection's protection domain (once per connection and slab) and answers with addr u64,
//     rkey u32, pages u32. Only the session's own slabs are registered: any other is refused
//     with StatusNoSlab, like a read. A page beyond the slab's end is the client's to refuse
//     (StatusRange): the region ends there, so the device would refuse it anyway.
//
// The registration holds a reference on the slab (its memory cannot go while the device may
// still write it) and lasts until the slab is freed (by its session or by the server) or the
// control connection closes; after that the rkey no longer works (a remote access error), and
// a client that gets one registers again, and is refused if the slab is gone. A server built
// without the rdma transport, or with no usable RDMA device, refuses both requests with
// StatusUnsupported. Both were added within version 1, as Map was: a server from before them
// closes the connection on them as malformed, and tcp and shm peers never send them.
package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the fabric protocol version this build speaks.
const Version = 2

// PageSize is the unit of every read and write.
const PageSize = 4096

// HeaderSize is the size of every frame header.
const HeaderSize = 24

// AddrSize is the size of one page address on the wire.
const AddrSize = 12

// MaxPages bounds the pages of one Read or Write (4 MiB of data).
const MaxPages = 1024

// FlagTraced marks a Read or Write request whose payload begins with a TraceContext.
const FlagTraced uint32 = 1

// TraceContextSize is the size of a trace context on the wire.
const TraceContextSize = 16 + 8 + 1

// maxControlPayload bounds every payload that is not page data (handshake, grants, messages).
const maxControlPayload = 512

const magic = 0xFA4D

// Op is a frame's operation.
type Op uint8

const (
	OpChallenge    Op = iota + 1 // server -> client, first frame: version, nonce, instance id
	OpHello                      // client -> server: version, session, MAC; answered with status
	OpCreate                     // create the slab a Grant allows
	OpWrite                      // write count pages
	OpRead                       // read count pages
	OpFree                       // free a slab
	OpMap                        // unix sockets only: map a slab (answer: pages u32 + the memfd)
	OpRDMAConnect                // connect a queue pair (answer: the server's queue pair)
	OpRDMARegister               // register a slab for RDMA (answer: addr u64, rkey u32, pages u32)
)

func (o Op) String() string {
	switch o {
	case OpChallenge:
		return "challenge"
	case OpHello:
		return "hello"
	case OpCreate:
		return "create"
	case OpWrite:
		return "write"
	case OpRead:
		return "read"
	case OpFree:
		return "free"
	case OpMap:
		return "map"
	case OpRDMAConnect:
		return "rdma-connect"
	case OpRDMARegister:
		return "rdma-register"
	}
	return fmt.Sprintf("op(%d)", o)
}

// Status is an answer's outcome.
type Status uint8

const (
	StatusOK          Status = iota
	StatusAuth               // the MAC does not match: wrong token
	StatusVersion            // protocol versions differ
	StatusNoSlab             // no such slab for this session
	StatusRange              // a page beyond the slab's end
	StatusCapacity           // the server is full
	StatusBadGrant           // the grant is not the ctrl's, or not for this server or session
	StatusMalformed          // the request does not parse
	StatusUnsupported        // the server cannot serve this request (e.g. built without rdma)
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusAuth:
		return "auth"
	case StatusVersion:
		return "version"
	case StatusNoSlab:
		return "no-slab"
	case StatusRange:
		return "range"
	case StatusCapacity:
		return "capacity"
	case StatusBadGrant:
		return "bad-grant"
	case StatusMalformed:
		return "malformed"
	case StatusUnsupported:
		return "unsupported"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Header is a frame header.
type Header struct {
	Op     Op
	Status Status
	Count  uint32
	ID     uint64
	Len    uint32
	Flags  uint32
}

// Put encodes h into b[:HeaderSize].
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint16(b[0:], magic)
	b[2] = byte(h.Op)
	b[3] = byte(h.Status)
	binary.LittleEndian.PutUint32(b[4:], h.Count)
	binary.LittleEndian.PutUint64(b[8:], h.ID)
	binary.LittleEndian.PutUint32(b[16:], h.Len)
	binary.LittleEndian.PutUint32(b[20:], h.Flags)
}

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("fabric: malformed frame")

// ParseHeader decodes and bounds-checks a header: the payload length must fit the op.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d-byte header", ErrMalformed, len(b))
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != magic {
		return Header{}, fmt.Errorf("%w: bad magic %#04x (not a farmem fabric peer?)", ErrMalformed, m)
	}
	h := Header{Op: Op(b[2]), Status: Status(b[3]), Count: binary.LittleEndian.Uint32(b[4:]),
		ID: binary.LittleEndian.Uint64(b[8:]), Len: binary.LittleEndian.Uint32(b[16:]), Flags: binary.LittleEndian.Uint32(b[20:])}
	if h.Flags&^FlagTraced != 0 {
		return Header{}, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, h.Flags)
	}
	if h.Flags&FlagTraced != 0 && (h.Status != StatusOK || (h.Op != OpRead && h.Op != OpWrite)) {
		return Header{}, fmt.Errorf("%w: a traced %v with status %d (only Read and Write requests carry a trace context)", ErrMalformed, h.Op, h.Status)
	}
	if h.Count > MaxPages {
		return Header{}, fmt.Errorf("%w: %d pages in one %v (at most %d)", ErrMalformed, h.Count, h.Op, MaxPages)
	}
	if h.Len > maxPayload(h) {
		return Header{}, fmt.Errorf("%w: %d-byte %v payload (at most %d)", ErrMalformed, h.Len, h.Op, maxPayload(h))
	}
	return h, nil
}

// maxPayload is the most payload a frame with this header may carry, requests and answers.
func maxPayload(h Header) uint32 {
	n := h.Count
	switch {
	case h.Status != StatusOK:
		return maxControlPayload
	case h.Op == OpWrite && h.Flags&FlagTraced != 0:
		return TraceContextSize + n*(AddrSize+PageSize)
	case h.Op == OpWrite:
		return n * (AddrSize + PageSize) // request; its answer is empty
	case h.Op == OpRead && h.Flags&FlagTraced != 0:
		return TraceContextSize + n*AddrSize // a request: answers are never traced
	case h.Op == OpRead:
		return max(n*AddrSize, n*PageSize)
	case h.Op == OpChallenge || h.Op == OpHello || h.Op == OpCreate || h.Op == OpFree || h.Op == OpMap ||
		h.Op == OpRDMAConnect || h.Op == OpRDMARegister:
		return maxControlPayload
	}
	return 0
}

// TraceContext is the W3C trace context a traced request carries: the client span it is part
// of. A plain value, so that this package needs nothing of OpenTelemetry.
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   uint8 // W3C trace flags: bit 0, sampled
}

// Valid reports whether tc names a span: a zero trace or span id is no context at all.
func (tc *TraceContext) Valid() bool { return tc.TraceID != [16]byte{} && tc.SpanID != [8]byte{} }

// put encodes tc into b[:TraceContextSize].
func (tc *TraceContext) put(b []byte) {
	_ = b[TraceContextSize-1]
	copy(b, tc.TraceID[:])
	copy(b[16:], tc.SpanID[:])
	b[24] = tc.Flags
}

// parseTraceContext decodes b[:TraceContextSize]. An invalid context is malformed: a client
// that has none sends no flag.
func parseTraceContext(b []byte) (TraceContext, error) {
	var tc TraceContext
	copy(tc.TraceID[:], b[:16])
	copy(tc.SpanID[:], b[16:24])
	tc.Flags = b[24]
	if !tc.Valid() {
		return tc, fmt.Errorf("%w: a trace context with a zero trace or span id", ErrMalformed)
	}
	return tc, nil
}

// Addr names one page: a slab and a page index in it.
type Addr struct {
	Slab uint64
	Page uint32
}

// PutAddrs encodes addrs into b (len(addrs)*AddrSize bytes).
func PutAddrs(b []byte, addrs []Addr) {
	for i, a := range addrs {
		binary.LittleEndian.PutUint64(b[i*AddrSize:], a.Slab)
		binary.LittleEndian.PutUint32(b[i*AddrSize+8:], a.Page)
	}
}

// addrAt decodes the i-th address of b.
func addrAt(b []byte, i int) Addr {
	return Addr{Slab: binary.LittleEndian.Uint64(b[i*AddrSize:]), Page: binary.LittleEndian.Uint32(b[i*AddrSize+8:])}
}

// challenge is the server's first frame.
type challenge struct {
	Version  uint16
	Nonce    [32]byte
	Instance string
}

func (c *challenge) encode() []byte {
	b := make([]byte, 2+32+2+len(c.Instance))
	binary.LittleEndian.PutUint16(b, c.Version)
	copy(b[2:], c.Nonce[:])
	binary.LittleEndian.PutUint16(b[34:], uint16(len(c.Instance)))
	copy(b[36:], c.Instance)
	return b
}

func decodeChallenge(b []byte) (challenge, error) {
	var c challenge
	if len(b) < 2 {
		return c, fmt.Errorf("%w: %d-byte challenge", ErrMalformed, len(b))
	}
	c.Version = binary.LittleEndian.Uint16(b)
	if c.Version != Version {
		return c, nil // the caller reports the mismatch; the rest may be laid out differently
	}
	if len(b) < 36 {
		return c, fmt.Errorf("%w: %d-byte challenge", ErrMalformed, len(b))
	}
	copy(c.Nonce[:], b[2:34])
	n := int(binary.LittleEndian.Uint16(b[34:]))
	if len(b) != 36+n {
		return c, fmt.Errorf("%w: challenge instance id of %d bytes in %d", ErrMalformed, n, len(b))
	}
	c.Instance = string(b[36:])
	return c, nil
}

// hello is the client's answer to the challenge.
type hello struct {
	Version uint16
	Session SessionID
	MAC     MAC
}

const helloSize = 2 + 16 + 32

func (h *hello) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, h.Version)
	b = append(b, h.Session[:]...)
	return append(b, h.MAC[:]...)
}

func decodeHello(b []byte) (hello, error) {
	var h hello
	if len(b) < 2 {
		return h, fmt.Errorf("%w: %d-byte hello", ErrMalformed, len(b))
	}
	h.Version = binary.LittleEndian.Uint16(b)
	if h.Version != Version {
		return h, nil
	}
	if len(b) != helloSize {
		return h, fmt.Errorf("%w: %d-byte hello", ErrMalformed, len(b))
	}
	copy(h.Session[:], b[2:18])
	copy(h.MAC[:], b[18:50])
	return h, nil
}

// helloMAC is what a client proves the token with: bound to this connection's nonce, the
// session it speaks for and the server it speaks to.
func helloMAC(t Token, nonce [32]byte, s SessionID, instance string) MAC {
	return t.MAC([]byte("hello"), nonce[:], s[:], []byte(instance))
}

// encodeGrant is a Create's payload.
func encodeGrant(b []byte, g *Grant) []byte {
	b = binary.LittleEndian.AppendUint64(b, g.Slab)
	b = binary.LittleEndian.AppendUint32(b, g.Pages)
	b = append(b, g.Session[:]...)
	b = append(b, g.MAC[:]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(g.Server)))
	return append(b, g.Server...)
}

func decodeGrant(b []byte) (Grant, error) {
	var g Grant
	if len(b) < 62 {
		return g, fmt.Errorf("%w: %d-byte grant", ErrMalformed, len(b))
	}
	g.Slab = binary.LittleEndian.Uint64(b)
	g.Pages = binary.LittleEndian.Uint32(b[8:])
	copy(g.Session[:], b[12:28])
	copy(g.MAC[:], b[28:60])
	n := int(binary.LittleEndian.Uint16(b[60:]))
	if len(b) != 62+n {
		return g, fmt.Errorf("%w: grant server id of %d bytes in %d", ErrMalformed, n, len(b))
	}
	g.Server = string(b[62:])
	return g, nil
}

// RemoteError is an error answer from a memory server.
type RemoteError struct {
	Op      Op
	Status  Status
	Message string
}

func (e *RemoteError) Error() string { return fmt.Sprintf("fabric: %v refused: %s", e.Op, e.Message) }
