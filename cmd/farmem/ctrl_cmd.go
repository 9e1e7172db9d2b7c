package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"os/signal"
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

func ctrlCommand() *cli.Command {
	return &cli.Command{
		Name:  "ctrl",
		Usage: "run the control service: memory-server membership, slab placement, replicas, status API",
		Description: "Memory servers heartbeat to the ctrl; clients (farmem run --ctrl) open a session and get\n" +
			"slabs placed on servers chosen by power of two choices on free memory, each replica on a\n" +
			"different server, with a signed grant per replica. When a server stops heartbeating the\n" +
			"ctrl places a replacement for every replica it held and the client refills it from a\n" +
			"surviving copy; a slab with no copy left is reported lost and its program is stopped.\n" +
			"The state survives a restart of the ctrl. Runs until SIGINT or SIGTERM; membership\n" +
			"changes are logged to stderr, one line each.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: ctrlDefaultAddr, Usage: "HOST:PORT to serve the API on (memory servers, clients and farmem status connect here)"},
			&cli.StringFlag{Name: "state", Value: "/var/lib/farmem/ctrl", Usage: "directory keeping the ctrl's state across restarts (servers, sessions, slabs); created if\n\tmissing; one ctrl per directory"},
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
			return runCtrl(c.Context, c.App.ErrWriter, c.String("listen"), c.String("state"), ctrl.Config{
				Token:          tok,
				SlabPages:      uint32(slabBytes / ctrl.PageSize),
				DeadAfter:      deadAfter,
				SessionTimeout: sessionTimeout,
			})
		},
	}
}

func runCtrl(ctx context.Context, stderr io.Writer, listen, stateDir string, cfg ctrl.Config) error {
	if stderr == nil {
		stderr = os.Stderr
	}
	// log.Logger serializes lines written from the service's goroutines.
	lg := log.New(stderr, "farmem ctrl: ", log.LstdFlags|log.Lmsgprefix)
	store, err := ctrl.OpenFileStore(stateDir)
	if err != nil {
		return err
	}
	defer store.Close()
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: cfg, Store: store, Logf: lg.Printf})
	if err != nil {
		return err
	}
	// Before listening: once `listening` is printed, SIGTERM stops the ctrl cleanly.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", listen, err)
	}
	lg.Printf("listening on %s (state in %s, %s slabs, servers dead after %v, sessions after %v)",
		ln.Addr(), stateDir, ctrl.FormatBytes(uint64(cfg.SlabPages)*ctrl.PageSize), cfg.DeadAfter, cfg.SessionTimeout)
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
			&cli.StringFlag{Name: "ctrl", Value: ctrlDefaultAddr, Usage: "HOST:PORT of the farmem ctrl"},
			ctrlTokenFlag(""),
			&cli.BoolFlag{Name: "json", Usage: "print the ctrl's raw JSON status instead of tables"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem status takes no arguments (got %q)", c.Args().First())
			}
			tok, err := ctrlLoadToken(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			st, err := ctrl.NewClient(c.String("ctrl"), tok).Status(ctx)
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
