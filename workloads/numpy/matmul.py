#!/usr/bin/python3
"""matmul.py - a numpy batch job for farmem's benchmarks: C = A @ B over N x N float64 matrices.

    /usr/bin/python3 matmul.py [--mib M] [--reps R]   (Debian's python3 with python3-numpy)

N is chosen so that A, B and C together take about M MiB (3 * 8 * N^2 bytes). The entries are
small integers (A[i, j] = (i + 2j) % 7, B[i, j] = (3i + j) % 5), so every product and sum is
exact in float64 whatever order BLAS sums in (N * 6 * 4 < 2^53): the checksum (the sum of C and
a position-weighted sum, both exact integers) is the same on any machine and thread count, and
a capped run can be checked against arithmetic done here without numpy. R multiplications are
timed; their throughput is reported in GFLOP/s.

Output: "matmul: PHASE ... secs=S" lines, then "matmul: OK n=N checksum=S:W gflops=G" (exit 0)
or "matmul: BAD ..." (exit 1) when C differs from the closed form.
"""
import argparse
import sys
import time

import numpy as np


def expected(n):
    # sum over i, j of C[i, j] = sum over k of (sum_i A[i, k]) * (sum_j B[k, j]), exactly,
    # and sum over i, j of (i + j) * C[i, j] likewise, from column and row sums.
    i = np.arange(n, dtype=np.int64)
    colA = np.zeros(n, dtype=np.int64)  # sum_i A[i, k]
    wcolA = np.zeros(n, dtype=np.int64)  # sum_i i * A[i, k]
    rowB = np.zeros(n, dtype=np.int64)  # sum_j B[k, j]
    wrowB = np.zeros(n, dtype=np.int64)  # sum_j j * B[k, j]
    for k in range(n):
        a = (i + 2 * k) % 7
        b = (3 * k + i) % 5
        colA[k], wcolA[k] = a.sum(), (i * a).sum()
        rowB[k], wrowB[k] = b.sum(), (i * b).sum()
    s = int((colA * rowB).sum())
    w = int((wcolA * rowB).sum() + (colA * wrowB).sum())
    return s, w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    n = int(((a.mib << 20) / 24) ** 0.5)
    if n < 16 or a.reps < 1:
        ap.error("--mib too small or --reps < 1")
    t0 = time.monotonic()
    i = np.arange(n, dtype=np.float64)
    A = (i[:, None] + 2 * i[None, :]) % 7
    B = (3 * i[:, None] + i[None, :]) % 5
    C = np.empty((n, n))
    print(f"matmul: fill n={n} secs={time.monotonic() - t0:.3f}", flush=True)
    secs = 0.0
    for r in range(a.reps):
        t0 = time.monotonic()
        np.matmul(A, B, out=C)
        dt = time.monotonic() - t0
        secs += dt
        print(f"matmul: rep{r + 1} secs={dt:.3f} gflops={2 * n**3 / dt / 1e9:.2f}", flush=True)
    s = int(C.sum(dtype=np.float64))
    w = int(((i[:, None] + i[None, :]) * C).sum())
    es, ew = expected(n)
    if (s, w) != (es, ew):
        print(f"matmul: BAD n={n} checksum={s}:{w} want {es}:{ew}")
        return 1
    print(f"matmul: OK n={n} checksum={s}:{w} gflops={2 * n**3 * a.reps / secs / 1e9:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
