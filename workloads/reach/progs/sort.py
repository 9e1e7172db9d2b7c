# numpy: sort N pseudo-random int64 (a fixed seed) and print the sorted array's SHA-256.
# Run with Debian's /usr/bin/python3 and python3-numpy: python3 sort.py N
import hashlib
import sys

import numpy as np

n = int(sys.argv[1])
a = np.random.default_rng(12345).integers(0, 1 << 62, n, dtype=np.int64)
s = np.sort(a, kind="stable")
print("numpy sort n=%d sha256=%s" % (n, hashlib.sha256(s.tobytes()).hexdigest()))
