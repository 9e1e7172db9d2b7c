// Package ctrl is farmem's control plane: memory-server membership and health, slab placement
// by power of two choices on free memory, replicas on distinct servers, re-replication after a
// server dies, state kept across restarts, and the HTTP/JSON API behind `farmem status`.
//
// Lock order. There are three locks and Service.mu is never held together with another:
//
//	Service.mu      guards the Cluster (the state machine is not safe for concurrent use). Held
//	                only for in-memory work: no I/O, no logging, no waiting for another lock.
//	Service.saveMu  serializes writes to the Store; taken after mu is released, then
//	FileStore.mu    (a FileStore may be shared by several writers).
//
// So saveMu → FileStore.mu, and mu alone. That keeps a slow fsync from stalling heartbeats,
// while a request that changed placement still waits for saveMu before it replies: what the
// caller hears of is on disk.
//
// The split follows etcd's raft package: Cluster (cluster.go) is a deterministic state machine
// over plain values. Time is an argument of every method (it never reads the clock),
// randomness comes from an injected *rand.Rand, and what it decides comes back as return
// values and Events. The edges are small and separate: the HTTP service (service.go), request
// authentication (auth.go), persistence (store.go) and the Go client (client.go).
//
// The API (JSON; errors are {"error": "..."} with a status code, see the Err* kinds; every
// request carries AuthHeader):
//
//	POST   /v1/servers/heartbeat              ServerReport → HeartbeatReply (410: this server instance was declared dead)
//	POST   /v1/sessions                       {"name"} → Session
//	POST   /v1/sessions/{id}/heartbeat        → {"generation"} (404: session closed or expired)
//	POST   /v1/sessions/{id}/slabs            {"replicas"} → Slab (503: not enough live servers with room)
//	GET    /v1/sessions/{id}/slabs            → SlabMap
//	POST   /v1/sessions/{id}/slabs/{slab}/ready  {"server"} → {}
//	DELETE /v1/sessions/{id}/slabs/{slab}     → {}
//	DELETE /v1/sessions/{id}                  → {}
//	GET    /v1/status                         → Status
//
// A session's generation moves when its slab map changes behind the client's back (a replica
// dropped, a replacement placed, a slab lost), not for the client's own allocations, frees or
// ReplicaReady calls: the client refetches the map only when its heartbeat shows a new one.
//
// The ctrl is not on the fault path: clients cache their slab map and allocate ahead of need,
// and memory servers check the ctrl's signed grants themselves.
package ctrl
