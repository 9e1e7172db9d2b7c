package telemetry

// The attribute names the spans and the metrics share, so that a query can go from one to the
// other: a fault span's farmem.fault.source is the farmem.faults and farmem.fault.duration
// series' farmem.fault.source. All are in farmem's namespace, as OpenTelemetry's semantic
// conventions ask of an application's own attributes, but for the conventions' own:
// process.pid (on a span: the program's pid; on the resource: farmem's), server.address,
// client.address.
const (
	attrFaultSource     = "farmem.fault.source"         // zero, backend, wp, prefetch_cache
	attrFaultKind       = "farmem.fault.kind"           // read, write, wp
	attrEvictionOutcome = "farmem.eviction.outcome"     // written, clean_dropped, zero
	attrPrefetchStage   = "farmem.prefetch.stage"       // issued, placed, used
	attrIODirection     = "farmem.backend.io.direction" // read (from the backend), write (to it)
	attrServerState     = "farmem.backend.server.state" // up, down
	attrProcessPID      = "process.pid"
)
