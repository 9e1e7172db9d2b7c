package main

import (
	"bytes"
	"os/exec"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// runApp runs farmem's app in-process and returns its output and exit status.
func runApp(args ...string) (string, int) {
	var out bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &out
	code, msg := exitStatus(app.Run(append([]string{"farmem"}, args...)))
	if msg != "" {
		out.WriteString("farmem: " + msg + "\n")
	}
	return out.String(), code
}

// farmem help and farmem help COMMAND work as urfave/cli has them; a topic or a command that
// does not exist is bad input.
func TestHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{nil, 0, []string{"COMMANDS:", "\n   run ", "\n   version ", "--version"}},
		{[]string{"help"}, 0, []string{"COMMANDS:", "\n   run ", "\n   memserver ", "\n   sim ", "--help, -h"}},
		{[]string{"--help"}, 0, []string{"COMMANDS:", "exits 125"}},
		{[]string{"h"}, 0, []string{"COMMANDS:"}},
		{[]string{"help", "run"}, 0, []string{"farmem run - run a program", "--local-mem", "Exit status", "125 ", "126 ", "127 ", "128+N", "137"}},
		{[]string{"run", "--help"}, 0, []string{"farmem run - run a program", "--local-mem", "Exit status"}},
		{[]string{"run", "-h"}, 0, []string{"farmem run - run a program"}},
		{[]string{"help", "memserver"}, 0, []string{"farmem memserver - donate", "--capacity"}},
		{[]string{"help", "version"}, 0, []string{"farmem version - print farmem's version"}},
		{[]string{"help", "bogus"}, 125, []string{`farmem: no command "bogus": farmem help lists them`}},
		{[]string{"help", "run", "sim"}, 125, []string{"farmem help takes one command"}},
		{[]string{"bogus"}, 125, []string{`farmem: no command "bogus"`}},
		{[]string{"--bogus"}, 125, []string{"flag provided but not defined: -bogus"}},
	} {
		out, code := runApp(c.args...)
		if code != c.code {
			t.Errorf("farmem %s: exit %d, want %d:\n%s", strings.Join(c.args, " "), code, c.code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("farmem %s: no %q in:\n%s", strings.Join(c.args, " "), w, out)
			}
		}
	}
}

// A flag's help says "required" only where it is: farmem run's --token-file only with --ctrl.
func TestHelpRequired(t *testing.T) {
	flagLine := regexp.MustCompile(`^ +(--[a-z-]+)`)
	for cmd, want := range map[string]map[string]string{
		"run":       {"--local-mem": "; required.", "--token-file": "; required with --ctrl", "--ca": "; required unless the ctrl is on a loopback address"},
		"ctrl":      {"--token-file": "; required"},
		"status":    {"--token-file": "; required", "--ca": "; required unless the ctrl is on a loopback address"},
		"memserver": {"--capacity": "; required.", "--ctrl": "; required", "--token-file": "; required", "--ca": "; required unless the ctrl is on a loopback address"},
		"sim":       {"--trace": "; required"},
	} {
		out, code := runApp(cmd, "--help")
		if code != 0 {
			t.Fatalf("farmem %s --help: exit %d", cmd, code)
		}
		// Each flag's whole help: its first line and the indented lines after it.
		got := map[string]string{}
		var flag string
		for _, l := range strings.Split(out, "\n") {
			if m := flagLine.FindStringSubmatch(l); m != nil {
				flag = m[1]
			}
			if flag != "" {
				got[flag] += l + " "
			}
		}
		for f, text := range got {
			w, ok := want[f]
			switch {
			case ok && !strings.Contains(strings.Join(strings.Fields(text), " "), w):
				t.Errorf("farmem %s --help: %s does not say %q: %s", cmd, f, w, text)
			case !ok && strings.Contains(text, "required"):
				t.Errorf("farmem %s --help: %s says required: %s", cmd, f, text)
			}
		}
		for f := range want {
			if got[f] == "" {
				t.Errorf("farmem %s --help has no %s", cmd, f)
			}
		}
	}
}

func TestDescribeVersion(t *testing.T) {
	info := func(version string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/farmem/farmem", Version: version}, Settings: settings}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}
	for _, c := range []struct {
		name    string
		bi      *debug.BuildInfo
		stamped string
		want    string
	}{
		{"make build", info("(devel)"), "0123456789ab", "(devel), commit 0123456789ab, go1.99"},
		{"make build, dirty tree", info("(devel)"), "0123456789ab-dirty", "(devel), commit 0123456789ab-dirty, go1.99"},
		{"go build in a checkout", info("(devel)", rev, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "", "(devel), commit 0123456789ab, go1.99"},
		{"go build, modified", info("(devel)", rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "", "(devel), commit 0123456789ab-dirty, go1.99"},
		{"stamp wins", info("(devel)", rev), "fedcba987654", "(devel), commit fedcba987654, go1.99"},
		{"go install of a release", info("v1.2.3"), "", "v1.2.3, commit unknown (built without a VCS stamp: make build stamps it), go1.99"},
	} {
		if got := describeVersion(c.bi, c.stamped); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := describeVersion(nil, ""); !strings.HasPrefix(got, "(devel), commit unknown") {
		t.Errorf("no build info: %q", got)
	}
}

// farmem version and farmem --version print the same line, with the commit make build stamped.
func TestVersion(t *testing.T) {
	bin := farmemBin(t)
	var lines []string
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("farmem %s: %v\n%s", args[0], err, out)
		}
		lines = append(lines, string(out))
	}
	if lines[0] != lines[1] || lines[1] != lines[2] || !strings.HasPrefix(lines[0], "farmem version ") || strings.Count(lines[0], "\n") != 1 {
		t.Errorf("farmem version, --version, -v: %q, %q, %q; want one and the same line", lines[0], lines[1], lines[2])
	}
	if _, err := exec.Command("git", "rev-parse", "HEAD").Output(); err != nil {
		t.Skipf("not in a git checkout (%v): no commit to compare", err)
	}
	if why := staleVersion(lines[0]); why != "" {
		t.Errorf("farmem version: %q: %s (stale bin/farmem? make build)", lines[0], why)
	}
	out, err := exec.Command(bin, "version", "extra").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 {
		t.Errorf("farmem version extra: %v %q, want exit 125", err, out)
	}
}

// staleVersion says why the version line does not describe the checkout's code, or "" if it
// does: it names HEAD, or a commit HEAD descends from with the same code (a commit made while the
// tests ran, of results or documents, moves HEAD without making the binary stale).
func staleVersion(line string) string {
	_, after, ok := strings.Cut(line, "commit ")
	if !ok {
		return "no commit named"
	}
	built, _, _ := strings.Cut(after, ",")
	built = strings.TrimSuffix(built, "-dirty")
	if exec.Command("git", "merge-base", "--is-ancestor", built, "HEAD").Run() != nil {
		return "names " + built + ", which HEAD does not descend from"
	}
	// Paths from the top: a test runs in its package's directory.
	code := []string{"diff", "--quiet", built, "HEAD", "--", ":/*.go", ":/*.c", ":/*.h", ":/go.mod", ":/go.sum", ":/Makefile"}
	if exec.Command("git", code...).Run() != nil {
		return "the code changed between " + built + " and HEAD"
	}
	return ""
}
