package main

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The size grammar every size flag takes (--local-mem's help says it to users):
//
//	NUMBER [UNIT]   NUMBER: digits, optionally with a fraction (1.5GiB); no sign, no exponent
//	                UNIT, letters in any case unless said:
//	                  none, B                 bytes
//	                  K, M, G, T              binary (1024-based), as docker and systemd read them
//	                  KiB, MiB, GiB, TiB      binary
//	                  KB (or kB), MB, GB, TB  decimal (1000-based), as SI; these exact spellings only
//	NUMBER%         that share of the machine's physical memory, more than 0 and at most 100
//	                (--local-mem and --capacity only)
//
// K and KiB (and so on) are the same; KB is not: it is 1000 bytes. The lowercase-b spellings
// (kb, mb, gb, tb, Mb...) are refused rather than guessed: docker reads 512mb as 512MiB, SI as
// 512MB (5% less; 10% at tb), and Mb is a megabit. Either guess would take some users' cap
// silently off what they meant; the error names both spellings.

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// decimalUnits are case-sensitive: their other spellings are ambiguous (see above).
var decimalUnits = map[string]int64{"KB": 1e3, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}

var (
	sizeRE     = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?) *([A-Za-z%]*)$`)
	exponentRE = regexp.MustCompile(`^[0-9.]+[eE][-+]?[0-9]+`)
)

// maxSize bounds every size: far beyond any machine, and safe from overflow in page counts.
const maxSize = 1 << 62

// parseSize reads a size in the grammar above, without the percentage form.
func parseSize(s string) (int64, error) { return parseSizeOf(s, nil) }

// parseMemSize reads a size in the grammar above; N% is N% of the machine's physical memory.
func parseMemSize(s string) (int64, error) { return parseSizeOf(s, memTotal) }

// parseSizeOf parses s; total, if not nil, gives the bytes a percentage is a share of.
func parseSizeOf(s string, total func() (int64, error)) (int64, error) {
	in := strings.TrimSpace(s)
	if strings.HasPrefix(in, "-") {
		return 0, fmt.Errorf("size %q must be positive", s)
	}
	m := sizeRE.FindStringSubmatch(in)
	if m == nil {
		if exponentRE.MatchString(in) {
			return 0, fmt.Errorf("cannot parse size %q: no exponents; write the number out (1000) or use a unit (1KB)", s)
		}
		return 0, fmt.Errorf("cannot parse size %q: give a number and a unit, e.g. 512m, 512MiB, 800MB, 25%%", s)
	}
	num, unit := m[1], m[2]
	if unit == "%" {
		if total == nil {
			return 0, fmt.Errorf("size %q: a percentage of the machine's memory is not taken here", s)
		}
		pct, _ := strconv.ParseFloat(num, 64)
		if pct <= 0 || pct > 100 {
			return 0, fmt.Errorf("size %q: give a percentage of the machine's memory above 0 and at most 100", s)
		}
		mem, err := total()
		if err != nil {
			return 0, fmt.Errorf("size %q: %v", s, err)
		}
		return int64(float64(mem) * pct / 100), nil
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		if mult, ok = decimalUnits[unit]; !ok {
			return 0, unitError(s, num, unit)
		}
	}
	if whole, err := strconv.ParseInt(num, 10, 64); err == nil {
		if whole == 0 {
			return 0, fmt.Errorf("size %q must be positive", s)
		}
		if whole > maxSize/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return whole * mult, nil // exact, whatever its size
	}
	v, _ := strconv.ParseFloat(num, 64) // the pattern admits only numbers ParseFloat reads
	b := v * float64(mult)
	switch {
	case v == 0:
		return 0, fmt.Errorf("size %q must be positive", s)
	case b < 1:
		return 0, fmt.Errorf("size %q is less than a byte", s)
	case b > maxSize:
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(b), nil // a fraction of a byte is dropped
}

// unitError says what is wrong with an unknown unit: an ambiguous spelling of a decimal one
// names both readings.
func unitError(s, num, unit string) error {
	if low := strings.ToLower(unit); len(low) == 2 && low[1] == 'b' && strings.ContainsRune("kmgt", rune(low[0])) {
		n := num + strings.ToUpper(unit[:1])
		return fmt.Errorf("size %q: %q is ambiguous: write %s or %siB for binary (1024-based), %sB for decimal (1000-based)", s, unit, n, n, n)
	}
	return fmt.Errorf("cannot parse size %q: unknown unit %q (give k, m, g, t or KiB, MiB... for binary, KB, MB... for decimal, B or none for bytes)", s, unit)
}

// meminfoPath is where memTotal reads the machine's memory.
var meminfoPath = "/proc/meminfo"

// memTotal is the machine's physical memory: MemTotal in /proc/meminfo, else sysinfo's total
// RAM. Not a cgroup's limit: a percentage is of the machine, as docker and systemd take it.
func memTotal() (int64, error) {
	if n, err := meminfoTotal(meminfoPath); err == nil {
		return n, nil
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("cannot tell the machine's memory: %v", err)
	}
	return int64(si.Totalram) * int64(si.Unit), nil
}

// meminfoTotal reads MemTotal (in kB: KiB) from a file in /proc/meminfo's format.
func meminfoTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("%s: MemTotal line %q", path, sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || kb <= 0 || kb > math.MaxInt64>>10 {
			return 0, fmt.Errorf("%s: MemTotal line %q", path, sc.Text())
		}
		return kb << 10, nil
	}
	return 0, errors.New(path + ": no MemTotal line")
}

// formatSize gives bytes in the largest binary unit that keeps one decimal: 10.2MiB.
func formatSize(b int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(b), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%dB", b)
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0") + units[i]
}
