package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// The managed-runtime workloads: programs whose memory a garbage collector lays out and walks,
// not the program itself.
//
//   - jvm-g1, jvm-parallel: workloads/jvm/HeapGraph.java on Debian's OpenJDK, under G1 or the
//     Parallel collector. A HashMap of records that link to one another (an object graph over
//     the whole heap), updated at random in shuffled passes that leave old-generation garbage;
//     the collector's marking and copying touch the whole live graph. The heap is fixed
//     (-Xms = -Xmx, 400 MiB at scale 1, live data about half of it).
//   - node: workloads/node/objects.js on Debian's nodejs. Small objects indexed by a Map,
//     shuffled and relinked into one cycle, keys and arrays replaced as they go (1M objects at
//     scale 1), V8's heap limits fixed.
//
// Each prints a checksum that must equal the native run's, after checking its own structure
// (every record where it was put; the links one cycle through every object). Their throughput
// is updates per second over the passes, the build excluded. The runtimes are told everything
// they would otherwise size from the machine or the memory cgroup (heap limits, GC threads,
// huge pages), so that the native, farmem and swap runs configure the same program: a JVM or a
// node in a memory cgroup sizes its heap from the cgroup's limit, and the swap runs' limit is
// the cap.

const (
	javaBin  = "/usr/bin/java"
	javacBin = "/usr/bin/javac"
	nodeBin  = "/usr/bin/node"
	// heapGraphSrc is compiled at the harness's start into jvmClasses (bin/jvm, outside git).
	heapGraphSrc = "workloads/jvm/HeapGraph.java"
	objectsJS    = "workloads/node/objects.js"
)

// jvmClasses is where HeapGraph.class is put and run from (a test's own directory in tests).
var jvmClasses = "bin/jvm"

// Entries per MiB of heap: HeapGraph's records take about 190 bytes each (the record, its
// payload, the map's node and boxed key, the key array), so this keeps the live data at about
// half the heap after every pass, where both collectors work but neither runs out of heap.
const heapGraphPerMiB = 2500

// jvmWorkload is HeapGraph under collector gc ("G1" or "Parallel").
func jvmWorkload(name, gc string, s float64) workload {
	heap := scaled(400, s, 16)
	args := []string{javaBin, fmt.Sprintf("-Xms%dm", heap), fmt.Sprintf("-Xmx%dm", heap), "-XX:+Use" + gc + "GC",
		// This machine's 2 CPUs, said rather than found, so that the runs configure alike.
		"-XX:ParallelGCThreads=2"}
	if gc == "G1" {
		args = append(args, "-XX:ConcGCThreads=1")
	}
	args = append(args,
		// Small pages, as every other workload here has (the heap would be madvised for THP).
		"-XX:-UseTransparentHugePages",
		// Nothing sized from the swap runs' memory cgroup.
		"-XX:-UseContainerSupport",
		// No hsperfdata file: a shared file mapping in /tmp the program writes to.
		"-XX:-UsePerfData",
		"-cp", jvmClasses, "HeapGraph", "--entries", strconv.Itoa(heap*heapGraphPerMiB), "--passes", "2")
	title := "JVM " + gc + " GC (HashMap graph)"
	return workload{name: name, title: title, metric: "updates/s (2 passes)", args: args,
		digest: regexp.MustCompile(`(?m)^heapgraph: OK entries=\d+ checksum=([0-9a-f]{16}) `)}
}

// nodeWorkload is objects.js. Its old space may grow to about three times what it reaches
// natively: the limit is fixed (V8's growing factor depends on it), and high enough that no run
// collects for lack of room.
func nodeWorkload(s float64) workload {
	args := []string{nodeBin, "--max-old-space-size=" + strconv.Itoa(scaled(1024, s, 64)), "--max-semi-space-size=16",
		objectsJS, "--objects", strconv.Itoa(scaled(1_000_000, s, 10_000)), "--passes", "2"}
	return workload{name: "node", title: "node objects", metric: "updates/s (2 passes)", args: args,
		digest: regexp.MustCompile(`(?m)^objects: OK objects=\d+ checksum=([0-9a-f]{16}) `)}
}

// runtimePass matches a runtime workload's per-pass line: (updates, secs).
var runtimePass = regexp.MustCompile(`(?m)^(?:heapgraph|objects): pass\d+ updates=(\d+) secs=([0-9.]+)`)

func isRuntime(w workload) bool {
	return strings.HasPrefix(w.name, "jvm-") || w.name == "node"
}

// prepareRuntimes checks that the runtimes the workloads need are installed, and compiles
// HeapGraph (a second or two; always, so that the class run is the source's).
func prepareRuntimes(wls []workload) error {
	jvm, node := false, false
	for _, w := range wls {
		jvm = jvm || strings.HasPrefix(w.name, "jvm-")
		node = node || w.name == "node"
	}
	if node {
		if _, err := os.Stat(nodeBin); err != nil {
			return fmt.Errorf("%s is missing: apt-get install nodejs", nodeBin)
		}
	}
	if !jvm {
		return nil
	}
	for _, b := range []string{javaBin, javacBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: apt-get install openjdk-17-jdk-headless", b)
		}
	}
	return compileHeapGraph()
}

func compileHeapGraph() error {
	if err := os.MkdirAll(jvmClasses, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(javacBin, "--release", "17", "-Xlint:all", "-Werror", "-d", jvmClasses, heapGraphSrc).CombinedOutput()
	if err != nil {
		return fmt.Errorf("javac %s: %v: %s", heapGraphSrc, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// runtimeVersions is the first line of -version of each runtime the workloads run, by binary:
// the report names it beside the command.
func runtimeVersions(wls []workload) map[string]string {
	v := map[string]string{}
	for _, w := range wls {
		if !isRuntime(w) || v[w.args[0]] != "" {
			continue
		}
		flag, prefix := "-version", "" // java: `openjdk version "17.0.15" 2025-04-15`
		if w.args[0] == nodeBin {
			flag, prefix = "--version", "node " // node: v20.20.2
		}
		if out, err := exec.Command(w.args[0], flag).CombinedOutput(); err == nil {
			line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
			v[w.args[0]] = prefix + line
		}
	}
	return v
}
