package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

const ctrlDefaultAddr = "127.0.0.1:7000"

// ctrlLoadToken reads --token-file. Without the flag it is bad input (exit 125); a file that
// cannot be read or is too short is a plain failure.
func ctrlLoadToken(c *cli.Context) (fabric.Token, error) {
	tok, err := fabric.LoadToken(c.String("token-file"))
	if err != nil && c.String("token-file") == "" {
		return nil, usageError{err.Error()}
	}
	return tok, err
}

// ctrlTokenFlag is --token-file; required says when it is: "" if always, else the condition
// ("with --ctrl").
func ctrlTokenFlag(required string) cli.Flag {
	when := "required"
	if required != "" {
		when = "required " + required
	}
	return &cli.StringFlag{Name: "token-file", Usage: "file holding the cluster's shared secret, the same on the ctrl, every memory server and\n\tevery client (make one with: openssl rand -hex 32 > token); " + when}
}

// caFlag is --ca, for the commands that talk to the ctrl.
func caFlag() cli.Flag {
	return &cli.StringFlag{Name: "ca", Usage: "FILE: the cluster CA (ca.pem from farmem cert): reach the ctrl over TLS and trust only a\n\tcertificate it signed; required unless the ctrl is on a loopback address"}
}

// ctrlClient is a client of the ctrl named by --ctrl, with --token-file and --ca. A ctrl that
// would be reached in clear off loopback is bad input: the token would cross the network.
func ctrlClient(c *cli.Context) (*ctrl.Client, error) {
	tok, err := ctrlLoadToken(c)
	if err != nil {
		return nil, err
	}
	if c.String("ca") == "" {
		if err := ctrl.CheckPlaintext(c.String("ctrl")); err != nil {
			return nil, usageError{err.Error()}
		}
		return ctrl.NewClient(c.String("ctrl"), tok, nil), nil
	}
	ca, err := ctrl.LoadCA(c.String("ca"))
	if err != nil {
		return nil, err
	}
	return ctrl.NewClient(c.String("ctrl"), tok, ca), nil
}

func ctrlCommand() *cli.Command {
	return &cli.Command{
		Name:  "ctrl",
		Usage: "run the control service: memory-server membership, slab placement, replicas, status API",
		Description: "Memory servers heartbeat to the ctrl; clients (farmem run --ctrl) open a session and get\n" +
			"slabs placed on servers chosen by power of two choices on free memory, each replica on a\n" +
			"different server, with a signed grant per replica. When a server stops heartbeating the\n" +
			"ctrl places a replacement for every replica it held and the client refills it from a\n" +
			"surviving copy; a slab with no copy left is reported lost and its program is stopped.\n" +
			"The state survives a restart of the ctrl: in --state DIR, or with --etcd in etcd, where\n" +
			"every change is a transaction conditioned on the state it was decided on. The API is\n" +
			"served over TLS (--tls-cert, --tls-key; make them with farmem cert), or in clear on a\n" +
			"loopback address only. Runs until SIGINT or SIGTERM; membership changes are logged to\n" +
			"stderr, one line each.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: ctrlDefaultAddr, Usage: "HOST:PORT to serve the API on (memory servers, clients and farmem status connect here)"},
			&cli.StringFlag{Name: "state", Value: "/var/lib/farmem/ctrl", Usage: "directory keeping the ctrl's state across restarts (servers, sessions, slabs); created if\n\tmissing; one ctrl per directory"},
			&cli.StringFlag{Name: "etcd", Usage: "URL[,URL...]: keep the state in etcd (its members' client URLs, e.g. http://10.0.0.5:2379)\n\tinstead of --state. Any number of ctrls may share one etcd: one leads (an etcd election),\n\tthe others name it to clients, and one takes over when it stops"},
			&cli.StringFlag{Name: "advertise", Usage: "with --etcd: HOST:PORT clients reach this ctrl at, told to them by the other ctrls (default:\n\t--listen)"},
			&cli.StringFlag{Name: "etcd-prefix", Value: ctrl.DefaultEtcdPrefix, Usage: "with --etcd: the keys of this cluster's state (one prefix per farmem cluster)"},
			&cli.IntFlag{Name: "etcd-max-txn-ops", Value: 128, Usage: "with --etcd: the etcd servers' --max-txn-ops (a change of the state is one transaction)"},
			&cli.StringFlag{Name: "etcd-ca", Usage: "with https:// --etcd endpoints: FILE, the CA of the etcd servers' certificates (default: the\n\tsystem's)"},
			&cli.StringFlag{Name: "etcd-cert", Usage: "with https:// --etcd endpoints: FILE, this ctrl's client certificate, for an etcd that checks\n\tits clients' (--client-cert-auth)"},
			&cli.StringFlag{Name: "etcd-key", Usage: "FILE: the key of --etcd-cert"},
			&cli.StringFlag{Name: "tls-cert", Usage: "FILE: the ctrl's TLS certificate (farmem cert makes it); the API is then served over TLS"},
			&cli.StringFlag{Name: "tls-key", Usage: "FILE: the key of --tls-cert"},
			ctrlTokenFlag(""),
			&cli.StringFlag{Name: "slab-size", Value: "64MiB", Usage: "size of the slabs clients allocate on memory servers, a multiple of 4KiB, at least 1MiB:\n\tSIZE as 64m or 64MiB (1024-based) or a byte count; slabs already placed keep their size"},
			&cli.DurationFlag{Name: "dead-after", Value: ctrl.DefaultDeadAfter, Usage: "a memory server silent this long is dead and its replicas are replaced (servers\n\theartbeat every 500ms; at least 1s)"},
			&cli.DurationFlag{Name: "session-timeout", Value: ctrl.DefaultSessionTimeout, Usage: "a client session silent this long has ended and its slabs are freed (clients\n\theartbeat every 1s; at least 3s)"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem ctrl takes no arguments (got %q)", c.Args().First())
			}
			tok, err := ctrlLoadToken(c)
			if err != nil {
				return err
			}
			slabBytes, err := parseSize(c.String("slab-size"))
			if err != nil {
				return usagef("--slab-size: %v", err)
			}
			if slabBytes%ctrl.PageSize != 0 || slabBytes < 1<<20 || slabBytes/ctrl.PageSize > math.MaxUint32 {
				return usagef("--slab-size %s must be a multiple of 4KiB between 1MiB and 16TiB", c.String("slab-size"))
			}
			deadAfter, sessionTimeout := c.Duration("dead-after"), c.Duration("session-timeout")
			if deadAfter < 2*ctrl.ServerInterval {
				return usagef("--dead-after %v is too short: servers heartbeat every %v, so at least %v", deadAfter, ctrl.ServerInterval, 2*ctrl.ServerInterval)
			}
			if sessionTimeout < 3*ctrl.SessionInterval {
				return usagef("--session-timeout %v is too short: clients heartbeat every %v, so at least %v", sessionTimeout, ctrl.SessionInterval, 3*ctrl.SessionInterval)
			}
			opt := ctrlOptions{listen: c.String("listen"), stateDir: c.String("state"), etcdPrefix: c.String("etcd-prefix"), etcdMaxOps: c.Int("etcd-max-txn-ops")}
			if c.IsSet("etcd") {
				if c.IsSet("state") {
					return usagef("--state and --etcd both say where the state is kept: give one")
				}
				opt.etcd = strings.Split(c.String("etcd"), ",")
				opt.advertise = c.String("advertise")
				if opt.advertise == "" {
					opt.advertise = opt.listen
					if host, port, err := net.SplitHostPort(opt.listen); err == nil && (host == "" || net.ParseIP(host).IsUnspecified() || port == "0") {
						return usagef("--listen %s is not an address clients can dial: give --advertise HOST:PORT too (the other ctrls send clients there)", opt.listen)
					}
				}
				if (c.String("etcd-cert") == "") != (c.String("etcd-key") == "") {
					return usagef("--etcd-cert and --etcd-key go together: the certificate and its key")
				}
				if strings.Contains(c.String("etcd"), "https://") {
					if opt.etcdTLS, err = ctrl.EtcdTLS(c.String("etcd-ca"), c.String("etcd-cert"), c.String("etcd-key")); err != nil {
						return err
					}
				} else if c.IsSet("etcd-ca") || c.IsSet("etcd-cert") || c.IsSet("etcd-key") {
					return usagef("--etcd-ca, --etcd-cert and --etcd-key apply to https:// --etcd endpoints")
				}
			} else if c.IsSet("etcd-prefix") || c.IsSet("etcd-max-txn-ops") || c.IsSet("advertise") || c.IsSet("etcd-ca") || c.IsSet("etcd-cert") || c.IsSet("etcd-key") {
				return usagef("--etcd-prefix, --etcd-max-txn-ops, --etcd-ca, --etcd-cert, --etcd-key and --advertise apply to --etcd: give --etcd URL[,URL...] too")
			}
			if opt.etcdMaxOps < 3 {
				return usagef("--etcd-max-txn-ops %d: etcd takes at least 3 operations in a transaction", opt.etcdMaxOps)
			}
			switch cert, key := c.String("tls-cert"), c.String("tls-key"); {
			case (cert == "") != (key == ""):
				return usagef("--tls-cert and --tls-key go together: the certificate and its key")
			case cert != "":
				if opt.tls, err = ctrl.ServerTLS(cert, key); err != nil {
					return err
				}
			default:
				if err := ctrl.CheckPlaintext(opt.listen); err != nil {
					return usagef("--listen %s is not a loopback address, and the API carries the cluster token: serve it over TLS with --tls-cert and --tls-key (make them with farmem cert)", opt.listen)
				}
			}
			return runCtrl(c.Context, c.App.ErrWriter, opt, ctrl.Config{
				Token:          tok,
				SlabPages:      uint32(slabBytes / ctrl.PageSize),
				DeadAfter:      deadAfter,
				SessionTimeout: sessionTimeout,
			})
		},
	}
}

type ctrlOptions struct {
	listen     string
	stateDir   string
	etcd       []string // endpoints; nil: the state is in stateDir
	etcdPrefix string
	etcdMaxOps int
	advertise  string      // with etcd: the address the other ctrls send clients to
	etcdTLS    *tls.Config // for https:// etcd endpoints
	tls        *tls.Config // nil: the API in clear (loopback only)
}

func runCtrl(ctx context.Context, stderr io.Writer, opt ctrlOptions, cfg ctrl.Config) error {
	if stderr == nil {
		stderr = os.Stderr
	}
	// log.Logger serializes lines written from the service's goroutines.
	lg := log.New(stderr, "farmem ctrl: ", log.LstdFlags|log.Lmsgprefix)
	var store ctrl.Store
	var election *ctrl.ElectionConfig
	where := "state in " + opt.stateDir
	if opt.etcd != nil {
		es, err := ctrl.OpenEtcdStore(ctx, ctrl.EtcdConfig{Endpoints: opt.etcd, Prefix: opt.etcdPrefix, MaxTxnOps: opt.etcdMaxOps, TLS: opt.etcdTLS})
		if err != nil {
			return err
		}
		store, where = es, "state in etcd at "+strings.Join(opt.etcd, ",")+" under "+opt.etcdPrefix+", leads when elected"
		election = &ctrl.ElectionConfig{Advertise: opt.advertise}
	} else {
		fs, err := ctrl.OpenFileStore(opt.stateDir)
		if err != nil {
			return err
		}
		store = fs
	}
	defer store.Close()
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: cfg, Store: store, Logf: lg.Printf, Election: election})
	if err != nil {
		return err
	}
	// Before listening: once `listening` is printed, SIGTERM stops the ctrl cleanly.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", opt.listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", opt.listen, err)
	}
	proto := "in clear, loopback only"
	if opt.tls != nil {
		proto = "TLS"
		ln = tls.NewListener(ln, opt.tls)
	}
	lg.Printf("listening on %s (%s; %s, %s slabs, servers dead after %v, sessions after %v)",
		ln.Addr(), proto, where, ctrl.FormatBytes(uint64(cfg.SlabPages)*ctrl.PageSize), cfg.DeadAfter, cfg.SessionTimeout)
	err = svc.Serve(ctx, ln)
	lg.Printf("stopped")
	return err
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the cluster: memory servers, their health and memory, client sessions and their slabs",
		Description: "A slab is degraded while it has fewer ready copies than asked for (a replacement is being\n" +
			"filled, or no server has room for one yet) and lost when no copy survives.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "ctrl", Value: ctrlDefaultAddr, Usage: "HOST:PORT of the farmem ctrl, or a comma-separated list of the ctrls"},
			ctrlTokenFlag(""),
			caFlag(),
			&cli.BoolFlag{Name: "json", Usage: "print the ctrl's raw JSON status instead of tables"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem status takes no arguments (got %q)", c.Args().First())
			}
			cl, err := ctrlClient(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			st, err := cl.Status(ctx)
			if err != nil {
				return err
			}
			return writeResult(c, st, func(w io.Writer) { printCtrlStatus(w, st) })
		},
	}
}

func printCtrlStatus(out io.Writer, st ctrl.Status) {
	pages := func(n uint64) string { return ctrl.FormatBytes(n * ctrl.PageSize) }
	t := st.Totals
	if st.Leader != "" {
		fmt.Fprintf(out, "leading ctrl: %s\n", st.Leader)
	}
	fmt.Fprintf(out, "memory servers: %d healthy of %d, %s capacity, %s used; slabs of %s\n",
		t.HealthyServers, t.Servers, pages(t.CapacityPages), pages(t.UsedPages), pages(uint64(st.SlabPages)))
	if len(st.Servers) > 0 {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ADDR\tHEALTH\tCAPACITY\tUSED\tFREE\tSLABS\tLAST HEARTBEAT\tID")
		for _, s := range st.Servers {
			health, free := "healthy", pages(s.FreePages)
			if !s.Healthy {
				health, free = "DEAD", "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%s ago\t%s\n", s.Addr, health, pages(s.CapacityPages), pages(s.UsedPages),
				free, s.Slabs, (time.Duration(s.MsSinceHeartbeat) * time.Millisecond).String(), s.ID)
		}
		tw.Flush()
	}
	fmt.Fprintf(out, "\nsessions: %d, %d slabs (%d degraded, %d rebuilding, %d lost)\n", t.Sessions, t.Slabs, t.Degraded, t.Rebuilding, t.Lost)
	if len(st.Sessions) > 0 {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tSLABS\tREPLICAS\tDEGRADED\tREBUILDING\tLOST\tSESSION")
		for _, s := range st.Sessions {
			name := s.Name
			if name == "" {
				name = "-"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\n", name, s.Slabs, s.Replicas, s.Degraded, s.Rebuilding, s.Lost, s.ID)
		}
		tw.Flush()
	}
}
