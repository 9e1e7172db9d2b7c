package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixedTotal is a machine of 8 GiB.
func fixedTotal() (int64, error) { return 8 << 30, nil }

func TestSizeGrammar(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"1048576", 1 << 20},
		{"4096B", 4096},
		{"4096b", 4096},
		{"512k", 512 << 10},
		{"512K", 512 << 10},
		{"512m", 512 << 20},
		{"512M", 512 << 20},
		{"1g", 1 << 30},
		{"1G", 1 << 30},
		{"2t", 2 << 40},
		{"512MiB", 512 << 20},
		{"512mib", 512 << 20},
		{"512MIB", 512 << 20},
		{"1KiB", 1 << 10},
		{"2GiB", 2 << 30},
		{"1TiB", 1 << 40},
		{"800MB", 800e6},
		{"1KB", 1000},
		{"1kB", 1000},
		{"2GB", 2e9},
		{"1TB", 1e12},
		{"1.5GiB", 3 << 29},
		{"1.5g", 3 << 29},
		{"0.5KiB", 512},
		{" 64 MiB ", 64 << 20},
		{"25%", 2 << 30},
		{"12.5%", 1 << 30},
		{"100%", 8 << 30},
		{"9007199254740993", 9007199254740993}, // exact: not through a float
	} {
		got, err := parseSizeOf(c.in, fixedTotal)
		if err != nil || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
}

// Every bad size gets one line that names it and what is wrong.
func TestSizeErrors(t *testing.T) {
	for _, c := range []struct {
		in, want string
	}{
		{"12XB", `cannot parse size "12XB": unknown unit "XB"`},
		{"-5m", `size "-5m" must be positive`},
		{"-5MiB", `size "-5MiB" must be positive`},
		{"0", `size "0" must be positive`},
		{"0m", `size "0m" must be positive`},
		{"0.0GiB", `size "0.0GiB" must be positive`},
		{"0.5", `size "0.5" is less than a byte`},
		{"abc", `cannot parse size "abc": give a number and a unit`},
		{"", `cannot parse size "": give a number and a unit`},
		{"m", `cannot parse size "m": give a number and a unit`},
		{"150%", `size "150%": give a percentage of the machine's memory above 0 and at most 100`},
		{"0%", `size "0%": give a percentage of the machine's memory above 0 and at most 100`},
		{"1e3", `cannot parse size "1e3": no exponents`},
		{"1E9", `cannot parse size "1E9": no exponents`},
		{"1.5e3m", `cannot parse size "1.5e3m": no exponents`},
		{"+5m", `cannot parse size "+5m"`},
		{"0x10m", `cannot parse size "0x10m"`},
		{".5g", `cannot parse size ".5g"`},
		{"5.g", `cannot parse size "5.g"`},
		{"512mb", `size "512mb": "mb" is ambiguous: write 512M or 512MiB for binary (1024-based), 512MB for decimal (1000-based)`},
		{"1gb", `"gb" is ambiguous: write 1G or 1GiB`},
		{"1Mb", `"Mb" is ambiguous`},
		{"1mB", `"mB" is ambiguous`},
		{"1Kb", `"Kb" is ambiguous`},
		{"1tb", `"tb" is ambiguous`},
		{"1PiB", `unknown unit "PiB"`},
		{"5%%", `unknown unit "%%"`},
		{"99999999999T", `size "99999999999T" is too large`},
		{"99999999999.5T", `size "99999999999.5T" is too large`},
		{"99999999999999999999", `size "99999999999999999999" is too large`},
	} {
		_, err := parseSizeOf(c.in, fixedTotal)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseSize(%q): %v; want one line with %q", c.in, err, c.want)
		}
	}
	// Where no percentage is taken (--slab-size), one says so.
	if _, err := parseSize("25%"); err == nil || !strings.Contains(err.Error(), "a percentage of the machine's memory is not taken here") {
		t.Errorf("parseSize(25%%) without a total: %v", err)
	}
}

// A percentage is of MemTotal in /proc/meminfo.
func TestSizePercentOfMemTotal(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "meminfo")
	os.WriteFile(fake, []byte("MemTotal:        2048000 kB\nMemFree:          100000 kB\nMemAvailable:    1000000 kB\n"), 0o644)
	defer func(p string) { meminfoPath = p }(meminfoPath)
	meminfoPath = fake
	for _, c := range []struct {
		in   string
		want int64
	}{{"50%", 1024000 << 10}, {"100%", 2048000 << 10}, {"1%", 20480 << 10}, {"0.1%", 2048 << 10}} {
		if got, err := parseMemSize(c.in); err != nil || got != c.want {
			t.Errorf("parseMemSize(%q) with MemTotal 2048000 kB = %d, %v; want %d", c.in, got, err, c.want)
		}
	}

	// And the real one: this machine's MemTotal, as /proc/meminfo says it.
	meminfoPath = "/proc/meminfo"
	total, err := meminfoTotal("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := parseMemSize("25%"); err != nil || got != total/4 {
		t.Errorf("parseMemSize(25%%) = %d, %v; want a quarter of MemTotal %d", got, err, total)
	}

	// Without /proc/meminfo, sysinfo's total RAM: the same figure.
	meminfoPath = filepath.Join(t.TempDir(), "none")
	if got, err := parseMemSize("100%"); err != nil || got != total {
		t.Errorf("parseMemSize(100%%) by sysinfo = %d, %v; want MemTotal %d", got, err, total)
	}
}

func TestMeminfoTotalMalformed(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"no line":  "MemFree: 100 kB\n",
		"no unit":  "MemTotal: 100\n",
		"not kB":   "MemTotal: 100 MB\n",
		"negative": "MemTotal: -100 kB\n",
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		os.WriteFile(p, []byte(body), 0o644)
		if n, err := meminfoTotal(p); err == nil {
			t.Errorf("%s: MemTotal %d, want an error", name, n)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{100: "100B", 1 << 20: "1MiB", 10*(1<<20) + 200<<10: "10.2MiB", 3 << 29: "1.5GiB"} {
		if got := formatSize(in); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", in, got, want)
		}
	}
}
