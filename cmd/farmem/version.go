package main

import (
	"fmt"
	goruntime "runtime"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// commit is the commit farmem was built from, as make build stamps it (-ldflags
// "-X main.commit=..."): the go command's own stamp (vcs.revision) is missing wherever
// -buildvcs=false is set, as GOFLAGS often has it, and outside a git checkout.
var commit string

// version is farmem's version line: the module version, the commit, the Go release.
func version() string {
	bi, _ := debug.ReadBuildInfo()
	return describeVersion(bi, commit)
}

// describeVersion makes the version line from the build info (nil: none) and the stamped
// commit (empty: none; it ends in -dirty itself when the tree was).
func describeVersion(bi *debug.BuildInfo, stamped string) string {
	mod, goVersion := "(devel)", goruntime.Version()
	var rev string
	var modified bool
	if bi != nil {
		if bi.Main.Version != "" {
			mod = bi.Main.Version
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	c := stamped
	switch {
	case c != "":
	case rev != "":
		c = rev[:min(12, len(rev))]
		if modified {
			c += "-dirty"
		}
	default:
		c = "unknown (built without a VCS stamp: make build stamps it)"
	}
	return fmt.Sprintf("%s, commit %s, %s", mod, c, goVersion)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print farmem's version: the module version, the commit it was built from, the Go release",
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usageError{err.Error()}
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem version takes no arguments (got %q)", c.Args().First())
			}
			cli.VersionPrinter(c)
			return nil
		},
	}
}

// helpCommand is urfave/cli's help command (farmem help, farmem help COMMAND), except that a
// topic that is no command is bad input, exit status 125, where urfave/cli exits 3.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name:      "help",
		Aliases:   []string{"h"},
		Usage:     "show the commands, or one command's help",
		ArgsUsage: "[COMMAND]",
		Action: func(c *cli.Context) error {
			name := c.Args().First()
			switch {
			case c.NArg() > 1:
				return usagef("farmem help takes one command (got %q)", c.Args().Slice())
			case name == "":
				return cli.ShowAppHelp(c)
			case c.App.Command(name) == nil:
				return usagef("no command %q: farmem help lists them", name)
			}
			return cli.ShowCommandHelp(c, name)
		},
	}
}
