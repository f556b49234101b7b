"""
gka_solve_precision.py: what the operand formats of gka's chunkwise Chebyshev solve (spec/gka.md 5.1(c, d), run in
both the forward and the backward's adjoint solve) cost in accuracy, simulated in float64 on the CPU, for issue 11's
numerics question: version 9's solve (kernels/gka.cuh gka_chunk_solve_wgmma_kernel, "the trainer's" below: the bf16
trainer's until the incremental form, version 15, whose rows close the study) multiplies with x, H0 and
S = (X K^T) (.) M each in two bf16 pieces (hi = bf16(v), lo = bf16(v - hi); a product a.hi b.hi + a.lo b.hi +
a.hi b.lo), 5.24M multiply-adds per chunk and iteration at D = 128, BT = 64, where one piece each would be 2.10M.

Each scheme names a format and the pieces of x against H0, of H0, of x against the keys, and of S. A piece is v
rounded to the format's significand (round to nearest even): bf16 8 bits, fp16 11 (as many as TF32, what the
official kernels' dots keep), with no range limit. The keys K are bf16 already, exact in every format. Everything
else is float64: the states, f, the right-hand sides, the Chebyshev update, and the products' sums (the tensor
cores' fp32 accumulation, 2^-24, is far below every rounding modelled here). A second study takes IEEE half's real
range (numpy float16: overflow above 65504, subnormals below 6.1e-5; the keys converted too, unscaled) on wider
inputs (beta down to 1e-3, dO times 1e-6), with each row's system and H0 scaled by powers of two (chunked_solve
says how; exact, since the solve is linear in b and x(cH) = x(H)/c) and without: scaled must stay within 1e-2,
unscaled must not (its control).

What is measured, relative L2 over all (token, head) against the same chunked solve without rounding:
  x   the forward solve's x_t = CHEB(H_t, f_t, q_hat_t)
  z   the adjoint solve's z_t = CHEB(H_t, f_t, alpha_t dqt_t), dqt_t = s U_t do_t exact
  o   the readout s U_t^T (q_hat + alpha (x - q_hat)) from the simulated x, products exact
  dk  spec 3.2's backward (dk_t = (DH + DH^T) k_t + DU v_t) from the simulated x and z, everything else exact
So the figures are the solve's share of the error; the trainer's kernels add the other products' and fp32's.
The inputs are dev/cuda/gka_core.cu's kind (unit q_hat; k = (beta + 1e-6) unit vectors and v = (beta + 1e-6)
uniform [-1, 1] with beta in (0.05, 0.95); alpha in (0.05, 0.95); log decays in [-1, 0], in [-1e-3, 0] over the
middle third; dO uniform [-1, 1]; q, k, v rounded to bf16), T = 256 (four chunks), 2 heads, dk = dv = 128, r = 30.
The unrounded chunked solve is checked against spec 3.1's per-token CHEB first (float64, within 1e-10). Then, for
three schemes, where the iteration converges: x after r = 400 against the exact ridge solve.

Run: /usr/bin/python3 dev/cuda/gka_solve_precision.py   (numpy; about 75 seconds; exit 1 when the range check fails)
"""
import sys
import numpy as np

T, H, D, DV, BT, R, A = 256, 2, 128, 128, 64, 30, 0.02
SCALE = D ** -0.5
RHO4 = (1 / (1 + 2 * A)) ** 2 / 4


def rnd(v, bits):
    """v rounded to a significand of `bits` bits (round to nearest even), unlimited exponent range"""
    m, e = np.frexp(v)
    return np.ldexp(np.round(m * 2.0 ** bits) / 2.0 ** bits, e)


def bf16(v):
    return rnd(v, 8)


def fp16(v):
    """v as IEEE half (numpy's float16: 11 significand bits, overflow to inf above 65504, subnormals below 6.1e-5)"""
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(np.float64)


# the scaled rows' bound on |x|: 2^10, 64 times below half's largest 65504 for the iterates' excursions; with a bound
# of 1 instead, x's small components fall among half's subnormals (2^-24 apart) and dk misses by 6.5e-1 on the wide
# inputs below
ROW_EXP = 10
# format: (rounding, whether the solve scales its rows and H0 by powers of two to keep them in the format's range)
FORMATS = {"exact": (None, False), "bf16": (bf16, False), "fp16": (lambda v: rnd(v, 11), False),
           "fp16, range": (fp16, True), "fp16, unscaled": (fp16, False), "bf16 incremental": (bf16, False),
           "fp16 incremental": (lambda v: rnd(v, 11), False)}


def pieces(v, n, round_fn):
    if round_fn is None:
        return [v]
    hi = round_fn(v)
    return [hi] if n == 1 else [hi, round_fn(v - hi)]


def product(a, b, pa, pb, round_fn):
    """a @ b as the tensor cores see it: a.hi b.hi (+ a.lo b.hi with two pieces of a) (+ a.hi b.lo with two of b)"""
    A_, B_ = pieces(a, pa, round_fn), pieces(b, pb, round_fn)
    out = A_[0] @ B_[0]
    if len(A_) == 2:
        out += A_[1] @ B_[0]
    if len(B_) == 2:
        out += A_[0] @ B_[1]
    return out


def make_inputs(rng, wide=False):
    """the lab's inputs; wide: beta log-uniform in (1e-3, 0.95), so f down to 1e-6 and |x| up to 5e7, and dO
    scaled by 1e-6, as small gradients are"""
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    beta = np.exp(rng.uniform(np.log(1e-3), np.log(0.95), (H, T))) if wide else rng.uniform(0.05, 0.95, (H, T))
    q = bf16(unit(rng.standard_normal((H, T, D))))
    k = bf16((beta + 1e-6)[..., None] * unit(rng.standard_normal((H, T, D))))
    v = bf16((beta + 1e-6)[..., None] * rng.uniform(-1, 1, (H, T, DV)))
    alpha = rng.uniform(0.05, 0.95, (H, T))
    g = rng.uniform(-1, 0, (H, T))
    g[:, T // 3:2 * T // 3] = rng.uniform(-1e-3, 0, (H, 2 * T // 3 - T // 3))
    dO = rng.uniform(-1, 1, (H, T, DV)) * (1e-6 if wide else 1.0)
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


def chunked_solve(k, g, Hs, f, b, scheme, iters=R):
    """spec 5.1(c, d): every chunk's rows at once, HY = diag(zeta) X H0 + ((X K^T) (.) M) K with the scheme's operands.
    A mixed scheme (early, late, n_early) runs the first n_early iterations in scheme early, the rest in late (both
    unscaled).
    With scaling, row c's system is solved for 2^e_c x with 2^e_c b, 2^e_c the power of two at or below
    2^ROW_EXP a f_c / ||b_c|| (so |x| <= ||b|| / (a f) maps to at most 2^ROW_EXP), and H0 is used as 2^-e0 H0
    (2^e0 at or above max |H0|) with diag(2^e0 zeta): both exact, the solve being linear in b and x(cH) = x(H)/c.
    The incremental form (format "bf16 incremental"; kernels/gka.cuh's gka_chunk_solve_wgmma_kernel<false, false,
    true>): the products take the step d = x - x_prev, rounded to its pieces (those of x in the scheme) and applied as rounded,
    and H x is kept as the sum of the steps' products"""
    mixed = isinstance(scheme[0], tuple)
    early, late, n_early = scheme if mixed else (scheme, scheme, 0)
    round_fn, scaled = FORMATS[late[0]]
    incremental = late[0].endswith(" incremental")
    assert not (incremental and mixed), "the incremental form is not mixed"
    assert not (mixed and (scaled or FORMATS[early[0]][1])), "a mixed scheme's parts are unscaled"
    x_all = np.zeros((T, D))
    for n in range(T // BT):
        sl = slice(n * BT, (n + 1) * BT)
        H0 = Hs[n * BT - 1] if n > 0 else np.zeros((D, D))
        K = k[sl]
        gl = np.cumsum(g[sl])
        zeta = np.exp(gl)
        M = np.tril(np.exp(gl[:, None] - gl[None, :]))
        if round_fn is not None:
            K = round_fn(K)   # exact in bf16 and unlimited fp16; in half, keys below 6.1e-5 lose bits (subnormals)
        fc, bc = f[sl], b[sl]
        row_scale, h0_scale = np.ones(BT), 1.0
        if scaled:
            bn = np.linalg.norm(bc, axis=1)
            row_scale = np.where(bn > 0, 2.0 ** (ROW_EXP + np.floor(np.log2(A * fc / np.where(bn > 0, bn, 1)))), 1.0)
            bc = bc * row_scale[:, None]
            if np.abs(H0).max() > 0:
                h0_scale = 2.0 ** np.ceil(np.log2(np.abs(H0).max()))
                H0, zeta = H0 / h0_scale, zeta * h0_scale
        tau = (2 / (fc * (1 + 2 * A)))[:, None]
        xp, x, om = np.zeros_like(bc), tau * bc, 2.0
        if incremental:   # the first step d = x rounded, x = d; hx = H x (x_prev = 0)
            x = sum(pieces(x, late[3], round_fn))
            d, hx = x, np.zeros_like(x)
        for it in range(iters):
            fmt, pxh, ph, pxs, ps = early if it < n_early else late
            round_fn = FORMATS[fmt][0]
            om = 1 / (1 - RHO4 * om)
            op = d if incremental else x
            S = product(op, K.T, pxs, 1, round_fn) * M
            HY = zeta[:, None] * product(op, H0, pxh, ph, round_fn) + product(S, K, ps, 1, round_fn)
            if incremental:
                hx = hx + HY
                d = sum(pieces((om - 1) * d - tau * om * (hx + A * fc[:, None] * x - bc), pxs, round_fn))
                x = x + d
                continue
            y = tau * om * (HY + A * fc[:, None] * x - bc) + (om - 1) * xp
            xp, x = x, om * x - y
        x_all[sl] = x / row_scale[:, None]
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
    """multiply-adds per chunk and iteration: X H0, X K^T and S K at D = 128, BT = 64 (a mixed scheme's mean over
    the R iterations)"""
    if isinstance(scheme[0], tuple):
        early, late, n_early = scheme
        return (n_early * macs(early) + (R - n_early) * macs(late)) / R
    _, pxh, ph, pxs, ps = scheme
    xh = 1 + (pxh == 2) + (ph == 2)
    return (xh * BT * D * D + pxs * BT * BT * D + ps * BT * BT * D) / 1e6


SCHEMES = [   # (format, pieces of x in X H0, of H0, of x in X K^T, of S)
    ("bf16", 1, 1, 1, 1), ("bf16", 2, 1, 2, 1), ("bf16", 2, 2, 2, 1), ("bf16", 2, 1, 2, 2), ("bf16", 1, 1, 2, 2),
    ("bf16", 2, 2, 2, 2),
    ("fp16", 1, 1, 1, 1), ("fp16", 2, 1, 2, 1), ("fp16", 1, 1, 1, 2), ("fp16", 2, 1, 1, 2), ("fp16", 1, 1, 2, 2),
    ("fp16", 2, 1, 2, 2), ("fp16", 2, 2, 2, 2),
]
# the range study: IEEE half with the rows and H0 scaled, and without (which must fail on the wide inputs)
SCALED, UNSCALED = ("fp16, range", 1, 1, 2, 2), ("fp16, unscaled", 1, 1, 2, 2)
# mixed schemes: the first n iterations cheaper, the rest in the trainer's pieces (or fp16's 2, 1, 2, 2). The error
# made early is damped by the later iterations (roughly R^(r - n), spec 3.1's rate R = 0.754), and the fixed point is
# the late scheme's (at r = 400 below, 385 iterations after the first 15)
TRAINER, F16_H0_ONE = ("bf16", 2, 2, 2, 2), ("fp16", 2, 1, 2, 2)
MIXED_SCHEMES = [(("bf16", 1, 1, 2, 2), TRAINER, 15), (("bf16", 1, 1, 2, 2), TRAINER, 20),
                 (("fp16", 1, 1, 1, 1), TRAINER, 15), (("fp16", 1, 1, 1, 1), TRAINER, 20),
                 (("fp16", 1, 1, 1, 1), F16_H0_ONE, 15), (("fp16", 1, 1, 1, 1), F16_H0_ONE, 20)]
# the incremental form: the products on the rounded step d (one piece), H0 and S in two: 0.70 of version 9's
# multiply-adds; with H0 or S in one piece instead, what each second piece is for; and in fp16's 11 bits, where H0
# in one piece would save a product (unlimited range here: a bound on what the fp16 form could reach)
INCREMENTAL = ("bf16 incremental", 1, 2, 1, 2)
INCREMENTAL_SCHEMES = [INCREMENTAL, ("bf16 incremental", 1, 1, 1, 2), ("bf16 incremental", 1, 2, 1, 1),
                       ("bf16 incremental", 2, 2, 2, 2), ("fp16 incremental", 1, 1, 1, 2)]
RANGE_SCHEMES = [("bf16", 2, 2, 2, 2), ("fp16", 1, 1, 2, 2), SCALED, UNSCALED, ("fp16", 2, 1, 2, 2),
                 ("fp16, range", 2, 1, 2, 2)]


def study(inputs, schemes):
    """each scheme's relative L2 errors of x, z, o and dk over both heads"""
    q, k, v, alpha, g, dO = inputs
    ref, sims = [], {s: [] for s in schemes}
    for h in range(H):
        Hs, Us = states(k[h], v[h], g[h])
        f = np.linalg.norm(Hs, axis=(1, 2))
        x = chunked_solve(k[h], g[h], Hs, f, q[h], ("exact", 1, 1, 1, 1))
        for t in (0, 63, 64, 100, T - 1):   # the chunked form against spec 3.1, token by token
            want = cheb_token(Hs[t], f[t], q[h][t])
            err = np.linalg.norm(x[t] - want) / np.linalg.norm(want)
            if err > 1e-10:
                sys.exit(f"FAIL: the unrounded chunked solve differs from spec 3.1's CHEB at token {t}: {err:.2e}")
        rhs = alpha[h][:, None] * SCALE * np.einsum("tkv,tv->tk", Us, dO[h])   # alpha_t dqt_t
        z = chunked_solve(k[h], g[h], Hs, f, rhs, ("exact", 1, 1, 1, 1))
        o = lambda xx: SCALE * np.einsum("tkv,tk->tv", Us, q[h] + alpha[h][:, None] * (xx - q[h]))
        dk = lambda xx, zz: dk_from(k[h], v[h], q[h], alpha[h], g[h], dO[h], Hs, Us, f, xx, zz)
        ref.append((x, z, o(x), dk(x, z)))
        for s in schemes:
            with np.errstate(invalid="ignore", over="ignore"):
                xs, zs = chunked_solve(k[h], g[h], Hs, f, q[h], s), chunked_solve(k[h], g[h], Hs, f, rhs, s)
                sims[s].append((xs, zs, o(xs), dk(xs, zs)))
    with np.errstate(invalid="ignore", over="ignore"):
        return {s: [rel(np.concatenate([sims[s][h][i] for h in range(H)]),
                        np.concatenate([ref[h][i] for h in range(H)])) for i in range(4)] for s in schemes}


def table(errs):
    base = macs(("bf16", 2, 2, 2, 2))
    print("| format | pieces: x in X H0, H0, x in X K^T, S | MACs | vs the trainer's | x | z | o | dk |")
    print("|---|---|---|---|---|---|---|---|")
    for s, e in errs.items():
        print(f"| {label(s)} | {macs(s):.2f} | {macs(s) / base:.2f} | " + " | ".join(f"{v:.1e}" for v in e) + " |")


def label(s):
    """a scheme's format and pieces as the tables print them"""
    if isinstance(s[0], tuple):
        (fe, *pe), (fl, *pl), n = s
        return f"{fe} then {fl} (first {n}) | {', '.join(map(str, pe))}; then {', '.join(map(str, pl))}"
    return f"{s[0]} | {s[1]}, {s[2]}, {s[3]}, {s[4]}"


def ridge_fixed_points(inputs, schemes):
    """each scheme's x after 400 iterations (converged: spec 3.1's truncation 2 R^401 is nil) against the exact
    ridge solve (H_t + a f_t I)^-1 q_hat_t, the worst token's relative 2-norm error: where its fixed point lies"""
    q, k, v, alpha, g, dO = inputs
    Hs, Us = states(k[0], v[0], g[0])
    f = np.linalg.norm(Hs, axis=(1, 2))
    exact = np.stack([np.linalg.solve(Hs[t] + A * f[t] * np.eye(D), q[0][t]) for t in range(T)])
    return {s: float(np.max(np.linalg.norm(chunked_solve(k[0], g[0], Hs, f, q[0], s, 400) - exact, axis=1)
                            / np.linalg.norm(exact, axis=1))) for s in schemes}


def main():
    print(f"gka solve operand formats, simulated in float64: T={T}, {H} heads, dk=dv={D}, BT={BT}, r={R}, a={A}")
    print("relative L2 against the unrounded chunked solve; MACs per chunk-iteration (millions) at D=128, BT=64")
    print("the lab's inputs:")
    lab = make_inputs(np.random.default_rng(7))
    table(study(lab, SCHEMES))
    print("mixed schemes, the first n iterations in the first scheme, the rest in the second:")
    table(study(lab, MIXED_SCHEMES))
    print("the incremental form (the products on the step d = x - x_prev, rounded and applied as rounded; H x kept as"
          " the sum of the steps' products), the pieces of d, H0, d, S:")
    table(study(lab, [TRAINER] + INCREMENTAL_SCHEMES))
    fixed = ridge_fixed_points(lab, [("bf16", 2, 2, 2, 2), ("fp16", 2, 1, 2, 2), ("fp16", 1, 1, 2, 2),
                                     MIXED_SCHEMES[0], INCREMENTAL])
    print("r = 400 against the exact ridge solve (the fixed point; worst token, head 0): "
          + ", ".join(f"{label(s).replace(' | ', ' ')}: {e:.1e}" for s, e in fixed.items()))
    print("wide inputs (beta down to 1e-3, dO times 1e-6), IEEE half's range:")
    errs = study(make_inputs(np.random.default_rng(7), wide=True), RANGE_SCHEMES + [INCREMENTAL])
    table(errs)
    scaled, unscaled = errs[SCALED], errs[UNSCALED]
    ok = max(scaled) <= 1e-2 and not (max(unscaled) <= 1e-2)   # NaN compares false: it counts as failed
    print(("PASS" if ok else "FAIL") + f": scaled IEEE half within 1e-2 (worst {max(scaled):.1e}); unscaled"
          f" {'misses it (the range control is caught)' if not (max(unscaled) <= 1e-2) else 'within it (control NOT caught)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
