package procfs

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
)

// UffdRanges returns the mappings [start, end) of pid registered with a userfaultfd for missing
// pages (VmFlags "um" in /proc/PID/smaps), in address order.
func UffdRanges(pid int) ([][2]uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]uint64
	var cur [2]uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if m, ok := ParseMapsLine(l); ok {
			cur = [2]uint64{m.Start, m.End}
			continue
		}
		if strings.HasPrefix(l, "VmFlags:") && slices.Contains(strings.Fields(l), "um") {
			out = append(out, cur)
		}
	}
	return out, sc.Err()
}
