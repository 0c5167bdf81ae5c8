#!/usr/bin/env python3
"""Coefficients of exp2_poly (src/kernels/common/exp2_poly.h): 2^f on f in [-1/2, 1/2] (the
reduction z = j + f with j = rint(z)) by a polynomial of degree DEG with p(0) = 1 exactly, fitted
for relative error: an iterated weighted least-squares (Lawson) fit to minimax on a dense grid,
rounded to float32. Then the float32 evaluation of the kernel's order (Horner, one fused FMA per
step: emulated as the float64 a * b + c, exact product, rounded once to float32; a double rounding
can differ from the hardware's FFMA by one ulp in rare ties) against 2^f in float64.

  python3 scripts/fit_exp2_poly.py [DEG]   (default 5)

Prints the coefficients (c1..cDEG, as C float literals) and the max relative error of the float32
evaluation over the reduced interval; tests/cpp/test_exp2_poly.cpp checks the header's function
(std::fmaf, the same bit trick) against std::exp2 over [-130, 64].
"""
import sys

import numpy as np

DEG = int(sys.argv[1]) if len(sys.argv) > 1 else 5
f = np.linspace(-0.5, 0.5, 200001)
y = np.exp2(f)
# p(f) = 1 + f * q(f), q of degree DEG - 1: fit q to (2^f - 1) / f with weight f / 2^f (relative error).
fs = np.where(f == 0, 1e-300, f)
tgt = np.where(f == 0, np.log(2.0), np.expm1(f * np.log(2.0)) / fs)
A = np.vander(f, DEG, increasing=True)  # columns f^0 .. f^(DEG-1)
w = np.abs(f) / y + 1e-12
lw = np.ones_like(f)
for _ in range(200):  # Lawson: reweight by the error to approach equioscillation
    W = w * np.sqrt(lw)
    c, *_ = np.linalg.lstsq(A * W[:, None], tgt * W, rcond=None)
    err = np.abs((1 + f * (A @ c)) / y - 1)
    lw = lw * err
    lw /= lw.sum()
c32 = c.astype(np.float32)


def fma32(a, b, acc):
    return (a.astype(np.float64) * b.astype(np.float64) + acc.astype(np.float64)).astype(np.float32)


def p32(x):  # the kernel's order: Horner from the top, the last step fma(x, q, 1)
    x = x.astype(np.float32)
    q = np.full_like(x, c32[-1])
    for k in range(DEG - 2, -1, -1):
        q = fma32(q, x, np.full_like(x, c32[k]))
    return fma32(q, x, np.ones_like(x))


g = np.linspace(-0.5, 0.5, 2000001).astype(np.float32)
g = np.unique(np.concatenate([g, np.float32(-0.5) + np.arange(4096, dtype=np.float32) * np.float32(2**-24),
                              np.float32(0.5) - np.arange(4096, dtype=np.float32) * np.float32(2**-24)]))
rel_exact = np.max(np.abs((1 + f * (A @ c)) / y - 1))
rel32 = np.max(np.abs(p32(g).astype(np.float64) / np.exp2(g.astype(np.float64)) - 1))
print(f"degree {DEG}: c1..c{DEG} (p(f) = 1 + c1 f + ... + c{DEG} f^{DEG}, f in [-1/2, 1/2])")
for k, v in enumerate(c32, start=1):
    print(f"  c{k} = {float(v):.9e}f  ({float(v).hex()})")
print(f"max relative error: real-arithmetic fit {rel_exact:.3e} (2^{np.log2(rel_exact):.2f}); "
      f"float32 FMA evaluation {rel32:.3e} (2^{np.log2(rel32):.2f}); ex2.approx.ftz.f32 ~2^-22")
