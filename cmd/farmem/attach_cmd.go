package main

import (
	"errors"
	"os"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/launcher"
	"github.com/farmem/farmem/pagetable"
)

func attachCommand() *cli.Command {
	return &cli.Command{
		Name:      "attach",
		Usage:     "cap a process that is already running",
		ArgsUsage: "PID",
		Description: "farmem freezes every thread of the process (ptrace), puts its agent and a userfaultfd in\n" +
			"it as it does into a statically linked program, registers the process's anonymous memory\n" +
			"(heap, anonymous mappings, thread stacks), counts the pages it already has against the\n" +
			"cap, and lets it run: what is over the cap is evicted soon after. The children it forks\n" +
			"from then on are served too. farmem runs until the process exits, and then exits 0: it is\n" +
			"not the process's parent, and cannot learn its exit status.\n\n" +
			"SIGINT, SIGTERM or SIGHUP detaches: farmem brings every evicted page back into the process,\n" +
			"unregisters its memory, ends and unmaps its agent, closes what it put in, and exits 0,\n" +
			"leaving the process running as before with its data intact.\n\n" +
			"Unlike farmem run, no seccomp mapping filter is installed (one cannot be taken out of a\n" +
			"process again): new mappings are found by rescanning /proc/PID/maps, so a burst of writes\n" +
			"into fresh memory may pass the cap until the next rescan; and a fork child runs for a\n" +
			"moment (until farmem finds it, a few milliseconds) before it holds a copy of its own\n" +
			"userfaultfd. If farmem dies while attached, the process (and each child it entered) is\n" +
			"killed: it never reads zeros in place of its data.\n\n" +
			"It needs root or CAP_SYS_PTRACE over the process (kernel.yama.ptrace_scope below 3) and\n" +
			"userfaultfd. A process that is gone, already under farmem (it holds a userfaultfd), traced\n" +
			"by another, or that farmem may not trace gets a one-line error and exit status 125, and is\n" +
			"left as it was.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "local-mem", Usage: "cap on the process's resident anonymous memory, at least 16MiB; required. SIZE as for\n\tfarmem run: 512m, 512MiB, 800MB, a byte count, or 25%"},
			&cli.StringFlag{Name: "compress", Value: "none", Usage: "how the embedded backend keeps evicted pages: none, lz4 or zstd"},
			&cli.IntFlag{Name: "evict-heat", Value: pagetable.DefaultMaxHeat, Usage: "as for farmem run: extra rounds of the eviction queue a page may earn (0 to 15)"},
			writeGuessFlag(),
			&cli.BoolFlag{Name: "quiet", Usage: "nothing on stderr but errors"},
			&cli.StringFlag{Name: "summary-json", TakesFile: true, Usage: "at exit, write the summary to FILE as one JSON object, as farmem run does"},
		}, prefetchFlags()...),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			err := attachAction(c)
			var ex cli.ExitCoder
			if err != nil && !errors.As(err, &ex) {
				return cli.Exit(err.Error(), exitFailed)
			}
			return err
		},
	}
}

// attachAction is farmem attach: flags first, then the process, then the machine (all 125).
func attachAction(c *cli.Context) error {
	capBytes, err := localMem(c, "process")
	if err != nil {
		return err
	}
	if c.NArg() != 1 {
		return usagef("give one process id: usage is farmem attach --local-mem SIZE PID")
	}
	pid, err := strconv.Atoi(c.Args().First())
	if err != nil || pid <= 0 {
		return usagef("%q is not a process id: give a positive number", c.Args().First())
	}
	o, codec, err := pagingOptions(c, capBytes)
	if err != nil {
		return err
	}
	summaryJSON := c.String("summary-json")
	if summaryJSON != "" {
		if err := os.WriteFile(summaryJSON, nil, 0o644); err != nil {
			return usagef("--summary-json: %v", err)
		}
	}
	if err := launcher.CheckAttachable(pid); err != nil {
		return usagef("%v", err)
	}
	if err := checkUserfaultfd(); err != nil {
		return err
	}
	store := embeddedStore(codec)
	defer store.Close()
	o.LocalMem, o.Backend, o.Quiet, o.SummaryJSON = capBytes, store, c.Bool("quiet"), summaryJSON
	status, err := launcher.Attach(o, pid)
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	if status != 0 {
		return cli.Exit("", status)
	}
	return nil
}
