// Package ctrl is farmem's control plane: memory-server membership and health, slab placement
// by power of two choices on free memory, replicas on distinct servers, re-replication after a
// server dies or after a client reports a copy bad (a write to it failed, or it could not be
// created, while its server may live on: the copy is dropped and a replacement placed by the
// same rules, never on that server again until the slab is whole), state kept across restarts,
// and the HTTP/JSON API behind `farmem status`.
//
// Fields. Every field of Cluster and of the server, session and slab values it owns is guarded
// by Service.mu when a Service runs it (cluster.go); Service's own fields say which of mu and
// saveMu guards each (service.go); the election's leading and leaderName are atomics.
//
// Lock order. Service.mu is the innermost lock: no I/O, no logging and no other lock is taken
// while it is held.
//
//	Service.saveMu  serializes writes to the Store, and reloads after a lost race
//	Service.mu      guards the Cluster (the state machine is not safe for concurrent use). Held
//	                only for in-memory work; taken under saveMu only to Restore a reloaded state.
//	FileStore.mu / EtcdStore.mu   taken inside the store's methods (a store may be shared by
//	                several writers), under saveMu, never with mu held.
//
// So saveMu → mu and saveMu → store. That keeps a slow store from stalling heartbeats, while a
// request that changed placement still waits for its save before it replies: what the caller
// hears of is in the store.
//
// The split follows etcd's raft package: Cluster (cluster.go) is a deterministic state machine
// over plain values. Time is an argument of every method (it never reads the clock),
// randomness comes from an injected *rand.Rand, and what it decides comes back as return
// values and Events. The edges are small and separate: the HTTP service (service.go), request
// authentication (auth.go), persistence (store.go, etcdstore.go), certificates (cert.go) and
// the Go client (client.go).
//
// Stores and races. A Store holds the State at a Revision, and Save is a compare-and-swap on
// it (store.go): FileStore is one directory locked to one process; EtcdStore is etcd, shared by
// any number of ctrls, every change one transaction conditioned on the revision the change was
// decided on. A ctrl whose save loses to another writer changes nothing, reloads the state
// that writer saved, and decides the request again on it (Service.apply): so two ctrls never
// both place one slab, never hand out one slab id twice, and never both re-place one lost
// replica. A ctrl that cannot reach its store places nothing (the request fails; no grant
// leaves the ctrl).
//
// Several ctrls (election.go). Any number of ctrls may share one etcd: each campaigns in an
// etcd election (a lease it keeps alive and a key bound to it), the one with the oldest key
// leads, and only the leader runs the state machine — it loads the state when it wins, giving
// every server and session a fresh grace period, since it heard none of their heartbeats. The
// others answer every request with 421 (ErrNotLeader) naming the leader, and the Client, given
// the list of ctrls, goes there, or to the next ctrl when one cannot be reached, waiting out an
// election. The leader's saves are fenced on its leader key: once its lease has ended (it
// crashed, or was cut off from etcd for the lease's TTL) no save of it lands, so it places
// nothing more even before it notices; it stops deciding as soon as it does. A leader that
// stops cleanly saves, resigns, and the next one leads at once.
//
// Authentication and replay. The API is served over TLS (TLS 1.3; `farmem cert` makes a
// cluster CA and the ctrl's certificate, and clients trust only that CA), or in clear on a
// loopback address only. Every request bears the cluster token: "Authorization: Bearer TOKEN".
// Replay means re-sending a request someone else made. With TLS the bytes on the wire are
// useless for that: each connection's keys come from a fresh ephemeral key exchange, so
// recorded records, re-sent on a new connection, fail the handshake and nothing reaches the
// handler (tls_test.go replays a captured session-opening connection); inside one connection
// TLS's record sequence numbers refuse a repeated or reordered record; and Go's server accepts
// no 0-RTT early data, the one TLS 1.3 feature that admits replay. What is left is someone
// who holds the request in clear — a TLS-terminating proxy, a debug log — and that someone
// holds the token itself, which lets them make any request, so a per-request nonce would add
// nothing. On loopback in clear, only root on that host can read the traffic, and root can
// read the token file. A client never sends the token in clear off loopback (CheckPlaintext).
//
// The API (JSON; errors are {"error": "..."} with a status code, see the Err* kinds; every
// request carries the bearer token, else 401):
//
// With several ctrls, any request to a follower gets 421 {"error", "leader": "HOST:PORT"}.
//
//	POST   /v1/servers/heartbeat              ServerReport → HeartbeatReply (410: this server instance was declared dead)
//	POST   /v1/sessions                       {"name"} → Session
//	POST   /v1/sessions/{id}/heartbeat        → {"generation"} (404: session closed or expired)
//	POST   /v1/sessions/{id}/slabs            {"replicas"} → Slab (503: not enough live servers with room)
//	GET    /v1/sessions/{id}/slabs            → SlabMap
//	POST   /v1/sessions/{id}/slabs/{slab}/ready  {"server"} → {}
//	POST   /v1/sessions/{id}/bad              {"replicas": [{"slab", "server"}]} → {"kept": [...]} (copies a write or create failed on: re-placed; the last ready copy is kept)
//	DELETE /v1/sessions/{id}/slabs/{slab}     → {}
//	DELETE /v1/sessions/{id}                  → {}
//	GET    /v1/status                         → Status
//
// A session's generation moves when its slab map changes behind the client's back (a replica
// dropped, a replacement placed, a slab lost) or after a replica-bad report (the replacement is
// placed by the ctrl), not for the client's own allocations, frees or ReplicaReady calls: the
// client refetches the map only when its heartbeat shows a new one.
//
// The ctrl is not on the fault path: clients cache their slab map and allocate ahead of need,
// and memory servers check the ctrl's signed grants themselves.
package ctrl
