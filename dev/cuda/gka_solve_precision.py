"""
gka_solve_precision.py: what the operand formats of gka's chunkwise Chebyshev solve (spec/gka.md 5.1(c, d), run in
both the forward and the backward's adjoint solve) cost in accuracy, simulated in float64 on the CPU, for issue 11's
numerics question: the bf16 trainer's solve (kernels/gka.cuh gka_chunk_solve_wgmma_kernel) multiplies with x, H0 and
S = (X K^T) (.) M each in two bf16 pieces (hi = bf16(v), lo = bf16(v - hi); a product a.hi b.hi + a.lo b.hi +
a.hi b.lo), 5.24M multiply-adds per chunk and iteration at D = 128, BT = 64, where one piece each would be 2.10M.

Each scheme names a format and the pieces of x, H0 and S. A piece is v rounded to the format's significand
(round to nearest even): bf16 8 bits, fp16 11, tf32 11 (what the official kernels' TF32 dots keep). The exponent
range is not modelled: fp16 needs the solve's rows and H0 scaled by powers of two to stay in range (exact, since
x(cH) = x(H)/c and the rows are independent systems), which a kernel would do. The keys K are bf16 already, exact
in every format. Everything else is float64: the states, f, the right-hand sides, the Chebyshev update, and the
products' sums (the tensor cores' fp32 accumulation, 2^-24, is far below every rounding modelled here).

What is measured, relative L2 over all (token, head) against the same chunked solve without rounding:
  x   the forward solve's x_t = CHEB(H_t, f_t, q_hat_t)
  z   the adjoint solve's z_t = CHEB(H_t, f_t, alpha_t dqt_t), dqt_t = s U_t do_t exact
  o   the readout s U_t^T (q_hat + alpha (x - q_hat)) from the simulated x, products exact
  dk  spec 3.2's backward (dk_t = (DH + DH^T) k_t + DU v_t) from the simulated x and z, everything else exact
So the figures are the solve's share of the error; the trainer's kernels add the other products' and fp32's.
The inputs are dev/cuda/gka_core.cu's kind (unit q_hat; k = (beta + 1e-6) unit vectors and v = (beta + 1e-6)
uniform [-1, 1] with beta in (0.05, 0.95); alpha in (0.05, 0.95); log decays in [-1, 0], in [-1e-3, 0] over the
middle third; dO uniform [-1, 1]; q, k, v rounded to bf16), T = 256 (four chunks), 2 heads, dk = dv = 128, r = 30.
The unrounded chunked solve is checked against spec 3.1's per-token CHEB first (float64, within 1e-10).

Run: /usr/bin/python3 dev/cuda/gka_solve_precision.py   (numpy; about 30 seconds on 2 cores)
"""
import sys
import numpy as np

T, H, D, DV, BT, R, A = 256, 2, 128, 128, 64, 30, 0.02
SCALE = D ** -0.5
RHO4 = (1 / (1 + 2 * A)) ** 2 / 4
BITS = {"bf16": 8, "fp16": 11, "tf32": 11}


def rnd(v, bits):
    """v rounded to a significand of `bits` bits (round to nearest even), unlimited exponent range"""
    m, e = np.frexp(v)
    return np.ldexp(np.round(m * 2.0 ** bits) / 2.0 ** bits, e)


def bf16(v):
    return rnd(v, 8)


def pieces(v, n, bits):
    if bits is None:
        return [v]
    hi = rnd(v, bits)
    return [hi] if n == 1 else [hi, rnd(v - hi, bits)]


def product(a, b, pa, pb, bits):
    """a @ b as the tensor cores see it: a.hi b.hi (+ a.lo b.hi with two pieces of a) (+ a.hi b.lo with two of b)"""
    A_, B_ = pieces(a, pa, bits), pieces(b, pb, bits)
    out = A_[0] @ B_[0]
    if len(A_) == 2:
        out += A_[1] @ B_[0]
    if len(B_) == 2:
        out += A_[0] @ B_[1]
    return out


def make_inputs(rng):
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    beta = rng.uniform(0.05, 0.95, (H, T))
    q = bf16(unit(rng.standard_normal((H, T, D))))
    k = bf16((beta + 1e-6)[..., None] * unit(rng.standard_normal((H, T, D))))
    v = bf16((beta + 1e-6)[..., None] * rng.uniform(-1, 1, (H, T, DV)))
    alpha = rng.uniform(0.05, 0.95, (H, T))
    g = rng.uniform(-1, 0, (H, T))
    g[:, T // 3:2 * T // 3] = rng.uniform(-1e-3, 0, (H, 2 * T // 3 - T // 3))
    dO = rng.uniform(-1, 1, (H, T, DV))
    return q, k, v, alpha, g, dO


def states(k, v, g):
    """H_t, U_t for every token (spec 3), float64"""
    Hs, Us = np.zeros((T, D, D)), np.zeros((T, D, DV))
    Hm, Um = np.zeros((D, D)), np.zeros((D, DV))
    for t in range(T):
        gm = np.exp(g[t])
        Hm = gm * Hm + np.outer(k[t], k[t])
        Um = gm * Um + np.outer(k[t], v[t])
        Hs[t], Us[t] = Hm, Um
    return Hs, Us


def cheb_token(Hm, f, b):
    """spec 3.1's CHEB for one token, the check of the chunked form"""
    tau = 2 / (f * (1 + 2 * A))
    xp, x, om = np.zeros_like(b), tau * b, 2.0
    for _ in range(R):
        om = 1 / (1 - RHO4 * om)
        y = tau * om * (Hm @ x + A * f * x - b) + (om - 1) * xp
        xp, x = x, om * x - y
    return x


def chunked_solve(k, g, Hs, f, b, scheme):
    """spec 5.1(c, d): every chunk's rows at once, HY = diag(zeta) X H0 + ((X K^T) (.) M) K with the scheme's operands"""
    bits, pxh, ph, pxs, ps = scheme
    x_all = np.zeros((T, D))
    for n in range(T // BT):
        sl = slice(n * BT, (n + 1) * BT)
        H0 = Hs[n * BT - 1] if n > 0 else np.zeros((D, D))
        K = k[sl]
        gl = np.cumsum(g[sl])
        zeta = np.exp(gl)
        M = np.tril(np.exp(gl[:, None] - gl[None, :]))
        fc, bc = f[sl], b[sl]
        tau = (2 / (fc * (1 + 2 * A)))[:, None]
        xp, x, om = np.zeros_like(bc), tau * bc, 2.0
        for _ in range(R):
            om = 1 / (1 - RHO4 * om)
            S = product(x, K.T, pxs, 1, bits) * M
            HY = zeta[:, None] * product(x, H0, pxh, ph, bits) + product(S, K, ps, 1, bits)
            y = tau * om * (HY + A * fc[:, None] * x - bc) + (om - 1) * xp
            xp, x = x, om * x - y
        x_all[sl] = x
    return x_all


def dk_from(k, v, qh, alpha, g, dO, Hs, Us, f, x, z):
    """spec 3.2's sequential backward's dk for the given solves x and z (all else exact)"""
    qt = qh + alpha[:, None] * (x - qh)
    DH, DU = np.zeros((D, D)), np.zeros((D, DV))
    dk = np.zeros((T, D))
    for t in range(T - 1, -1, -1):
        DU = DU + SCALE * np.outer(qt[t], dO[t])
        w = 2 * A * (x[t] @ z[t]) / f[t]
        DH = DH - np.outer(z[t], x[t]) - (w / 2) * Hs[t]
        dk[t] = (DH + DH.T) @ k[t] + DU @ v[t]
        gm = np.exp(g[t])
        DH, DU = gm * DH, gm * DU
    return dk


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def macs(scheme):
    """multiply-adds per chunk and iteration: X H0, X K^T and S K at D = 128, BT = 64"""
    _, pxh, ph, pxs, ps = scheme
    xh = 1 + (pxh == 2) + (ph == 2)
    return (xh * BT * D * D + pxs * BT * BT * D + ps * BT * BT * D) / 1e6


SCHEMES = [   # (format, pieces of x in X H0, of H0, of x in X K^T, of S)
    ("bf16", 1, 1, 1, 1), ("bf16", 2, 1, 2, 1), ("bf16", 2, 2, 2, 1), ("bf16", 2, 1, 2, 2), ("bf16", 1, 1, 2, 2),
    ("bf16", 2, 2, 2, 2),
    ("fp16", 1, 1, 1, 1), ("fp16", 2, 1, 2, 1), ("fp16", 1, 1, 1, 2), ("fp16", 2, 1, 1, 2), ("fp16", 1, 1, 2, 2),
    ("fp16", 2, 1, 2, 2), ("fp16", 2, 2, 2, 2),
]


def main():
    rng = np.random.default_rng(7)
    q, k, v, alpha, g, dO = make_inputs(rng)
    ref, sims = [], {s: [] for s in SCHEMES}
    for h in range(H):
        Hs, Us = states(k[h], v[h], g[h])
        f = np.linalg.norm(Hs, axis=(1, 2))
        exact = (None, 1, 1, 1, 1)
        x = chunked_solve(k[h], g[h], Hs, f, q[h], exact)
        for t in (0, 63, 64, 100, T - 1):   # the chunked form against spec 3.1, token by token
            want = cheb_token(Hs[t], f[t], q[h][t])
            err = np.linalg.norm(x[t] - want) / np.linalg.norm(want)
            if err > 1e-10:
                print(f"FAIL: the unrounded chunked solve differs from spec 3.1's CHEB at token {t}: {err:.2e}")
                return 1
        dqt = SCALE * np.einsum("tkv,tv->tk", Us, dO[h])
        rhs = alpha[h][:, None] * dqt
        z = chunked_solve(k[h], g[h], Hs, f, rhs, exact)
        o = lambda xx: SCALE * np.einsum("tkv,tk->tv", Us, q[h] + alpha[h][:, None] * (xx - q[h]))
        ref.append((x, z, o(x), dk_from(k[h], v[h], q[h], alpha[h], g[h], dO[h], Hs, Us, f, x, z)))
        for s in SCHEMES:
            xs = chunked_solve(k[h], g[h], Hs, f, q[h], (BITS[s[0]],) + s[1:])
            zs = chunked_solve(k[h], g[h], Hs, f, rhs, (BITS[s[0]],) + s[1:])
            sims[s].append((xs, zs, o(xs), dk_from(k[h], v[h], q[h], alpha[h], g[h], dO[h], Hs, Us, f, xs, zs)))
    print(f"gka solve operand formats, simulated in float64: T={T}, {H} heads, dk=dv={D}, BT={BT}, r={R}, a={A}")
    print("relative L2 against the unrounded chunked solve; MACs per chunk-iteration (millions) at D=128, BT=64")
    print("| format | pieces: x in X H0, H0, x in X K^T, S | MACs | vs the trainer's | x | z | o | dk |")
    print("|---|---|---|---|---|---|---|---|")
    base = macs(("bf16", 2, 2, 2, 2))
    for s in SCHEMES:
        errs = [rel(np.concatenate([sims[s][h][i] for h in range(H)]), np.concatenate([ref[h][i] for h in range(H)]))
                for i in range(4)]
        print(f"| {s[0]} | {s[1]}, {s[2]}, {s[3]}, {s[4]} | {macs(s):.2f} | {macs(s) / base:.2f} | "
              + " | ".join(f"{e:.1e}" for e in errs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
