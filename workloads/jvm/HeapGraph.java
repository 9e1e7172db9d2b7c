/*
 * HeapGraph - a JVM batch job for farmem's benchmarks: a large HashMap whose values form an
 * object graph, built, then updated at random, then checked.
 *
 *     javac --release 17 -d bin/jvm workloads/jvm/HeapGraph.java
 *     java -Xms400m -Xmx400m -XX:+UseG1GC -cp bin/jvm HeapGraph --entries N [--passes P]
 *
 * The map holds N records keyed by pseudo-random longs. A record carries a value, a payload
 * array of 4 to 11 longs and a link to another record, so the collector traces a random graph
 * spread over the whole heap, as a cache or an in-memory index in a Java service does. Each of
 * the P passes shuffles the key array and then updates every record once in that order: a new
 * value, a new payload (the old one, usually promoted by then, becomes old-generation garbage),
 * a new link to a random record, and one record in 8 is removed and put back under a new key
 * (HashMap nodes and boxed keys churn too). The heap is fixed by -Xms/-Xmx; 2500 entries per
 * MiB of heap keep the live data at about half of it (a record with its payload, map node, boxed
 * key and key slot takes about 190 bytes), so the collector works but the run never runs out
 * of heap.
 *
 * Everything random comes from splitmix64 with a fixed seed, so the result does not depend on
 * the JVM, the collector or the machine. Two checks at the end:
 *   - the sum of every record's own hash (key, value, payload), kept up to date as the records
 *     change, must equal the sum recomputed by walking the map (and the map must hold N);
 *   - the digest, a sum over the records of a hash of the record and the key of the record it
 *     links to (a sum, so the map's iteration order does not enter it), is printed for the caller
 *     to compare with a native run's.
 *
 * Output: "heapgraph: build ...", "heapgraph: passK updates=N secs=S" per pass, "heapgraph: gc ...",
 * then "heapgraph: OK entries=N checksum=HEX updates_per_sec=U" (exit 0), or
 * "heapgraph: BAD ..." (exit 1) when the map does not match what was put in it.
 */
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.HashMap;
import java.util.Map;

public final class HeapGraph {
    static final class Rec {
        final long key;
        long val;
        long[] payload;
        Rec link;

        Rec(long key) {
            this.key = key;
        }
    }

    private long state;

    private HeapGraph(long seed) {
        state = seed;
    }

    // splitmix64: the next pseudo-random long.
    private long next() {
        state += 0x9E3779B97F4A7C15L;
        return mix(state);
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    // below is a pseudo-random int in [0, n).
    private int below(int n) {
        return (int) Long.remainderUnsigned(next(), n);
    }

    private long[] payload() {
        long[] p = new long[4 + below(8)];
        for (int i = 0; i < p.length; i++) {
            p[i] = next();
        }
        return p;
    }

    // own is a record's hash without its link: what the running sum tracks.
    private static long own(Rec r) {
        long h = mix(r.key ^ 0x5851F42D4C957F2DL) + r.val;
        for (long v : r.payload) {
            h = mix(h ^ v);
        }
        return h;
    }

    private static long withLink(Rec r) {
        return mix(own(r) ^ (r.link == null ? 0 : mix(r.link.key)));
    }

    private static void usage(String msg) {
        System.err.println("heapgraph: " + msg);
        System.err.println("usage: java ... HeapGraph --entries N [--passes P]");
        System.exit(2);
    }

    public static void main(String[] args) {
        int n = 0, passes = 2;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (i + 1 >= args.length) {
                usage("missing value for " + a);
            }
            int v = 0;
            try {
                v = Integer.parseInt(args[++i]);
            } catch (NumberFormatException e) {
                usage("bad number for " + a + ": " + args[i]);
            }
            switch (a) {
                case "--entries" -> n = v;
                case "--passes" -> passes = v;
                default -> usage("unknown flag " + a);
            }
        }
        if (n < 16 || passes < 1) {
            usage("--entries must be at least 16 and --passes at least 1");
        }
        System.exit(new HeapGraph(0x2545F4914F6CDD1DL).run(n, passes));
    }

    private int run(int n, int passes) {
        long t0 = System.nanoTime();
        Map<Long, Rec> map = new HashMap<>();
        long[] keys = new long[n];
        long sum = 0;
        for (int i = 0; i < n; i++) {
            long k = next();
            while (map.containsKey(k)) {
                k = next();
            }
            Rec r = new Rec(k);
            r.val = next();
            r.payload = payload();
            map.put(k, r);
            keys[i] = k;
            sum += own(r);
        }
        // The first links, once every record exists.
        for (int i = 0; i < n; i++) {
            map.get(keys[i]).link = map.get(keys[below(n)]);
        }
        System.out.printf("heapgraph: build entries=%d secs=%.3f%n", n, (System.nanoTime() - t0) / 1e9);

        double updSecs = 0;
        for (int p = 1; p <= passes; p++) {
            long t1 = System.nanoTime();
            for (int i = n - 1; i > 0; i--) { // Fisher-Yates
                int j = below(i + 1);
                long k = keys[i];
                keys[i] = keys[j];
                keys[j] = k;
            }
            for (int i = 0; i < n; i++) {
                Rec r = map.get(keys[i]);
                sum -= own(r);
                if ((next() & 7) == 0) {
                    // Re-keyed: a new record (a record's key is final, as a map key should be)
                    // takes over the old one's value and payload; links to the old one stay
                    // and keep it alive until they are replaced.
                    map.remove(r.key);
                    long k = next();
                    while (map.containsKey(k)) {
                        k = next();
                    }
                    Rec nr = new Rec(k);
                    nr.val = r.val;
                    nr.payload = r.payload;
                    map.put(k, nr);
                    keys[i] = k;
                    r = nr;
                }
                r.val = mix(r.val ^ next());
                r.payload = payload();
                r.link = map.get(keys[below(n)]);
                sum += own(r);
            }
            double s = (System.nanoTime() - t1) / 1e9;
            updSecs += s;
            System.out.printf("heapgraph: pass%d updates=%d secs=%.3f%n", p, n, s);
        }

        long gcs = 0, gcMs = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            System.out.printf("heapgraph: gc %s collections=%d ms=%d%n", gc.getName().replace(' ', '_'), gc.getCollectionCount(), gc.getCollectionTime());
            gcs += gc.getCollectionCount();
            gcMs += gc.getCollectionTime();
        }

        long walked = 0, digest = 0;
        for (Rec r : map.values()) {
            walked += own(r);
            digest += withLink(r);
        }
        if (map.size() != n || walked != sum) {
            System.out.printf("heapgraph: BAD entries=%d want %d sum=%016x want %016x%n", map.size(), n, walked, sum);
            return 1;
        }
        System.out.printf("heapgraph: OK entries=%d checksum=%016x updates_per_sec=%.0f gc_collections=%d gc_ms=%d%n",
                n, digest, (double) n * passes / updSecs, gcs, gcMs);
        return 0;
    }
}
