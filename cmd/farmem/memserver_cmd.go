package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
	"github.com/farmem/farmem/telemetry"
)

func memserverCommand() *cli.Command {
	return &cli.Command{
		Name:  "memserver",
		Usage: "donate this machine's memory: hold other machines' evicted pages",
		Description: "Registers with the ctrl and heartbeats to it; clients create slabs here only with a grant\n" +
			"the ctrl signed, and each client session reaches only its own slabs. Pages live in memory\n" +
			"(memfd), never on disk: if this server stops, its slabs are gone, and the ctrl re-places\n" +
			"the copies that lived here on other servers (clients with --replicas 2 or more lose\n" +
			"nothing). With --shm DIR, clients on this host may also map the slabs they own\n" +
			"(farmem run --transport shm): pages then move by memcpy, with no request to this server.\n" +
			"With --otlp (or OTEL_EXPORTER_OTLP_ENDPOINT), every read and write that a client's traced page\n" +
			"fault makes here over tcp (farmem run --otlp, its --trace-sample share) is exported as a span,\n" +
			"\"memserver read\" or \"memserver write\" (service farmem-memserver; OTEL_SERVICE_NAME overrides\n" +
			"it), a child of the client's \"backend fetch\" span in the client's trace: one trace shows both\n" +
			"sides. shm and rdma reads make no request to this server, so they have no server span.\n" +
			"The OTEL_* variables are read as farmem run reads them (farmem help run); OTEL_TRACES_SAMPLER,\n" +
			"if set, decides here too (unset: a request is traced exactly when the client traced its fault).\n" +
			"Runs until SIGINT or SIGTERM.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:7070", Usage: "HOST:PORT clients connect to"},
			&cli.StringFlag{Name: "advertise", Usage: "HOST:PORT clients should dial, if not --listen (say --listen 0.0.0.0:7070 --advertise 10.0.0.7:7070)"},
			&cli.StringFlag{Name: "capacity", Usage: "memory to donate, at least 1MiB; required. SIZE as for farmem run --local-mem: 32g or\n\t32GiB (1024-based), 32GB (1000-based), a byte count, or 50% (of this machine's memory: MemTotal)"},
			&cli.StringFlag{Name: "ctrl", Usage: "HOST:PORT of the farmem ctrl, or a comma-separated list of the ctrls (it moves to\n\tanother when its ctrl stops answering); required"},
			&cli.StringFlag{Name: "shm", Usage: "DIR: also serve clients on this host through shared memory (farmem run --transport shm), on the\n\tunix socket DIR/HOST:PORT.sock (HOST:PORT: the advertised address); e.g. --shm " + defaultSHMDir},
			spinFlag("after answering a request, poll for the connection's next one up to DURATION before sleeping", defaultServerSpin),
			ctrlTokenFlag(""),
			caFlag(),
		}, otlpFlags("a span of each traced request (see above)")...),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem memserver takes no arguments (got %q)", c.Args().First())
			}
			if !c.IsSet("capacity") {
				return usagef("--capacity SIZE is required: how much memory this server donates")
			}
			capBytes, err := parseMemSize(c.String("capacity"))
			if err != nil {
				return usagef("--capacity: %v", err)
			}
			if capBytes < 1<<20 {
				return usagef("--capacity %s (%s) is below 1MiB", c.String("capacity"), formatSize(capBytes))
			}
			if c.String("ctrl") == "" {
				return usagef("--ctrl HOST:PORT is required: the memory server registers with the ctrl")
			}
			spin, err := checkSpin(c)
			if err != nil {
				return err
			}
			tok, err := ctrlLoadToken(c)
			if err != nil {
				return err
			}
			ctrlc, err := ctrlClient(c)
			if err != nil {
				return err
			}
			advertise := c.String("advertise")
			if advertise == "" {
				advertise = c.String("listen")
				if host, _, err := net.SplitHostPort(advertise); err == nil && (host == "" || net.ParseIP(host).IsUnspecified()) {
					return usagef("--listen %s is not an address clients can dial: give --advertise HOST:PORT too", advertise)
				}
			}
			var tcfg telemetry.Config
			if err := resolveOTLP(c, &tcfg); err != nil {
				return err
			}
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return cli.Exit(fmt.Sprintf("memserver: %v", err), 1)
			}
			var shm *net.UnixListener
			if c.IsSet("shm") {
				if shm, err = listenSHM(c.String("shm"), advertise); err != nil {
					ln.Close()
					if _, ok := err.(usageError); ok {
						return err
					}
					return cli.Exit(fmt.Sprintf("memserver: --shm: %v", err), 1)
				}
			}
			logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
			tel, err := startServerTelemetry(tcfg, advertise)
			if err != nil {
				ln.Close()
				if shm != nil {
					shm.Close()
				}
				return err
			}
			scfg := fabric.ServerConfig{Token: tok, CapacityPages: capBytes / fabric.PageSize, Logf: logf, Spin: spin}
			if tel != nil {
				defer stopServerTelemetry(tel) // after srv.Close, below: the last requests' spans too
				scfg.Trace = tel.Trace
			}
			srv := fabric.NewServer(scfg)
			go srv.Serve(ln)
			if shm != nil {
				go srv.Serve(shm) // Close removes the socket
			}
			defer srv.Close()
			logf("farmem memserver: %s on %s (advertised as %s), instance %s, ctrl %s", ctrl.FormatBytes(uint64(capBytes)),
				ln.Addr(), advertise, srv.Instance(), c.String("ctrl"))
			if shm != nil {
				logf("farmem memserver: clients on this host may map their slabs through %s", shm.Addr())
			}
			if tel != nil {
				logf("farmem memserver: a span of each traced request goes to %s", tcfg.TracesTo())
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := ctrl.ServeHeartbeats(ctx, ctrlc, advertise, srv, logf); err != nil {
				return cli.Exit(fmt.Sprintf("memserver: %v", err), 1)
			}
			return nil
		},
	}
}
