package main

import (
	"fmt"
	"strconv"
	"strings"
)

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"TB", 1000 * 1000 * 1000 * 1000},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}, {"", 1},
}

// parseSize reads sizes like 512MiB, 2GB, 1.5GiB or 1048576 (bytes).
func parseSize(s string) (int64, error) {
	in := strings.TrimSpace(s)
	for _, u := range sizeUnits {
		if !strings.HasSuffix(in, u.suffix) {
			continue
		}
		num := strings.TrimSpace(strings.TrimSuffix(in, u.suffix))
		if num == "" {
			break
		}
		v, err := strconv.ParseFloat(num, 64)
		if err != nil || num[0] == '+' {
			break
		}
		if v <= 0 {
			return 0, fmt.Errorf("size %q must be positive", s)
		}
		if v*float64(u.mult) > 1<<62 {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return int64(v * float64(u.mult)), nil
	}
	return 0, fmt.Errorf("cannot parse size %q (use e.g. 512MiB, 2GiB, 800MB or a byte count)", s)
}
