"""
pkda_chunk_check.py: the chunkwise core of pkda (spec/pdn.md 3.1 and 3.4 with a per-channel decay, and the
16-row sub-block rule of spec 5), written as the CUDA kernels compute it, in numpy float64, against the
sequential recurrence and its reverse-time backward (spec 2.1-2.2) on a small problem: T = 150 (two full chunks of 64
and a partial one), dk = 8, dv = 6, per-channel log decays g in [-1, 0] with a near-0 stretch, read key k and write
key kt apart (kt = m k, m in [1/1.5, 1.5] as the preconditioner makes it).
What it checks is the algorithm, not CUDA: the intra-chunk products with exp(G[r,d] - G[s,d]) inside the sum over d,
formed as GEMMs on 16-row blocks whose exponents are taken against the block's first row (both factors <= 1, so
no overflow in fp32), the diagonal blocks per element, the chunk states with per-channel decay, the backward of
spec 3.4 in the same blocked form, and the decay gradient by the compact identity of 3.4 step 7. The kernels
(kernels/gdn_chunk.cuh with GDN_DECAY_CHANNEL) are checked against the recurrent core on dev/emu (dev/emu/pdn_chunk.cu)
and on the GPU (dev/cuda/pdn_core.cu, test_klacu).
A second run takes strong decays (g in [-4, 0]: within a chunk G reaches about -100, where exp(-G) overflows fp32)
and computes the chunked form in float32: every output must be finite and within 1e-4 of the float64 sequential
result (fp32 round-off over 150 steps), which the blocked exponents make possible.
Run with a python3 that has numpy (make test runs it with --negative):
    python3 dev/cuda/pkda_chunk_check.py              (exit 1 when an error exceeds its bound)
    python3 dev/cuda/pkda_chunk_check.py --negative   (also drops the chunk-end state terms from dG: must be caught)
"""
import sys
import numpy as np

T, DK, DV, BT, BS = 150, 8, 6, 64, 16

def problem(gmin):   # the inputs; dST is a gradient of the final state (the decode path's), to test the carries
    rng = np.random.default_rng(3)
    q = rng.standard_normal((T, DK)) / np.sqrt(DK)
    k = rng.standard_normal((T, DK)); k /= np.linalg.norm(k, axis=1, keepdims=True)
    kt = k * rng.uniform(1 / 1.5, 1.5, (T, DK))
    v = rng.uniform(-1, 1, (T, DV))
    beta = rng.uniform(0.05, 0.95, T)
    g = rng.uniform(gmin, 0, (T, DK)); g[T // 3:2 * T // 3] = rng.uniform(-1e-3, 0, (2 * T // 3 - T // 3, DK))
    return q, k, kt, v, beta, g, rng.uniform(-1, 1, (T, DV)), rng.uniform(-1, 1, (DK, DV))

# ---- the sequential recurrence and its backward (spec 2.1-2.2, the preconditioner left out: kt is an input)
def sequential():
    q, k, kt, v, beta, g, dO, dST = Q_, K_, KT_, V_, BETA_, G_, DO_, DST_
    S = np.zeros((DK, DV)); Sp, Ss, us, ps, o = [], [], [], [], np.zeros((T, DV))
    for t in range(T):
        S1 = np.exp(g[t])[:, None] * S
        p = v[t] - S1.T @ k[t]; u = beta[t] * p
        S = S1 + np.outer(kt[t], u)
        Sp.append(S1); Ss.append(S.copy()); us.append(u); ps.append(p); o[t] = S.T @ q[t]
    dS = dST.copy()
    dq, dk, dkt, dv, db, dg = (np.zeros_like(x) for x in (q, k, kt, v, beta, g))
    for t in reversed(range(T)):
        dS += np.outer(q[t], dO[t]); dq[t] = Ss[t] @ dO[t]
        dkt[t] = dS @ us[t]; du = dS.T @ kt[t]
        db[t] = du @ ps[t]; dv[t] = beta[t] * du
        dk[t] = -beta[t] * (Sp[t] @ du)
        dS1 = dS - beta[t] * np.outer(k[t], du)
        dg[t] = (Sp[t] * dS1).sum(1)
        dS = np.exp(g[t])[:, None] * dS1
    return o, S, dq, dk, dkt, dv, db, dg

# ---- the blocked intra-chunk products: X [n, dk] on the rows, Y [n, dk] on the columns, G [n, dk] the chunk's
# cumulative log decays. P[r, s] = sum_d X[r, d] Y[s, d] exp(G[r, d] - G[s, d]) for s < r (diag=False) or s <= r.
def blocked_decay_product(X, Y, G, diag):
    n = X.shape[0]; P = np.zeros((n, n), dtype=X.dtype)
    for i0 in range(0, n, BS):
        i1 = min(n, i0 + BS); ref = G[i0]               # the row block's reference row
        Xr = X[i0:i1] * np.exp(G[i0:i1] - ref)          # exponents <= 0
        for j0 in range(0, i0, BS):                     # off-diagonal blocks: one GEMM each
            P[i0:i1, j0:j0 + BS] = Xr @ (Y[j0:j0 + BS] * np.exp(ref - G[j0:j0 + BS])).T
        for r in range(i0, i1):                         # the diagonal block, per element
            for s in range(i0, r + 1 if diag else r):
                P[r, s] = np.sum(X[r] * Y[s] * np.exp(G[r] - G[s]))
    return P
# its two transposed uses in the backward: R[r] = sum_s D[r, s] Y[s] exp(G[r] - G[s]) (rows) and
# C[s] = sum_r D[r, s] X[r] exp(G[r] - G[s]) (columns), D lower triangular, the same blocks and references
def blocked_rows(D, Y, G):
    n = D.shape[0]; R = np.zeros((n, DK), dtype=D.dtype)
    for i0 in range(0, n, BS):
        i1 = min(n, i0 + BS); ref = G[i0]
        acc = np.zeros((i1 - i0, DK), dtype=D.dtype)
        for j0 in range(0, i0, BS):
            acc += D[i0:i1, j0:j0 + BS] @ (Y[j0:j0 + BS] * np.exp(ref - G[j0:j0 + BS]))
        R[i0:i1] = acc * np.exp(G[i0:i1] - ref)
        for r in range(i0, i1):
            for s in range(i0, r + 1):
                R[r] += D[r, s] * Y[s] * np.exp(G[r] - G[s])
    return R
def blocked_cols(D, X, G):
    n = D.shape[0]; C = np.zeros((n, DK), dtype=D.dtype)
    for i0 in range(0, n, BS):
        i1 = min(n, i0 + BS); ref = G[i0]
        Xr = X[i0:i1] * np.exp(G[i0:i1] - ref)
        for j0 in range(0, i0, BS):
            C[j0:j0 + BS] += (D[i0:i1, j0:j0 + BS].T @ Xr) * np.exp(ref - G[j0:j0 + BS])
        for r in range(i0, i1):
            for s in range(i0, r + 1):
                C[s] += D[r, s] * X[r] * np.exp(G[r] - G[s])
    return C

def chunked(negative, dt):
    q, k, kt, v, beta, g, dO, dST = (x.astype(dt) for x in (Q_, K_, KT_, V_, BETA_, G_, DO_, DST_))
    NT = (T + BT - 1) // BT
    S = np.zeros((DK, DV), dtype=dt); saved = []
    o = np.zeros((T, DV), dtype=dt)
    for c in range(NT):                                  # forward, spec 3.1
        t0 = c * BT; n = min(BT, T - t0); sl = slice(t0, t0 + n)
        G = np.cumsum(g[sl], axis=0); gam = G[n - 1]
        K, Kt, Q, V, b = k[sl], kt[sl], q[sl], v[sl], beta[sl]
        Akk0 = blocked_decay_product(K, Kt, G, False)    # without beta
        Akk = b[:, None] * Akk0
        Aqk = blocked_decay_product(Q, Kt, G, True)
        Tm = np.linalg.inv(np.eye(n, dtype=dt) + Akk)
        Kbg = b[:, None] * K * np.exp(G)
        W = Tm @ Kbg; U = Tm @ (b[:, None] * V)
        Vn = U - W @ S
        o[sl] = (Q * np.exp(G)) @ S + Aqk @ Vn
        saved.append((G, gam, Akk0, Aqk, Tm, Kbg, W, Vn, S.copy()))
        S = np.exp(gam)[:, None] * S + (Kt * np.exp(gam - G)).T @ Vn
    dq, dk, dkt, dv, db, dg = (np.zeros_like(x) for x in (q, k, kt, v, beta, g))
    dS1 = dST.copy()
    for c in reversed(range(NT)):                        # backward, spec 3.4
        t0 = c * BT; n = min(BT, T - t0); sl = slice(t0, t0 + n)
        G, gam, Akk0, Aqk, Tm, Kbg, W, Vn, S0 = saved[c]
        K, Kt, Q, V, b, dOc = k[sl], kt[sl], q[sl], v[sl], beta[sl], dO[sl]
        Kend = Kt * np.exp(gam - G)
        dVn = Aqk.T @ dOc + Kend @ dS1                                            # 1
        dS0 = (Q * np.exp(G)).T @ dOc + np.exp(gam)[:, None] * dS1 - W.T @ dVn    # 2
        dAqk = np.tril(dOc @ Vn.T)                                                # 3
        dQ = (dOc @ S0.T) * np.exp(G) + blocked_rows(dAqk, Kt, G)
        dKt = blocked_cols(dAqk, Q, G)
        dKt_state = (Vn @ dS1.T) * np.exp(gam - G)
        dKt += dKt_state
        dWm = -dVn @ S0.T; dUm = dVn                                              # 4
        dTm = dWm @ Kbg.T + dUm @ (b[:, None] * V).T                              # 5
        dKbg = Tm.T @ dWm; dVb = Tm.T @ dUm
        dAkk = np.tril(-Tm.T @ dTm @ Tm.T, -1)
        dK = b[:, None] * np.exp(G) * dKbg + b[:, None] * blocked_rows(dAkk, Kt, G)   # 6
        dKt += blocked_cols(dAkk * b[:, None], K, G)
        dv[sl] = b[:, None] * dVb
        db[sl] = (dKbg * K * np.exp(G)).sum(1) + (dVb * V).sum(1) + (dAkk * Akk0).sum(1)
        dG = Q * dQ + K * dK - Kt * dKt                                           # 7
        if not negative:
            dG[n - 1] += (Kt * dKt_state).sum(0) + (dS1 * (np.exp(gam)[:, None] * S0)).sum(1)
        dg[sl] = np.cumsum(dG[::-1], axis=0)[::-1]
        dq[sl], dk[sl], dkt[sl] = dQ, dK, dKt
        dS1 = dS0
    return o, S, dq, dk, dkt, dv, db, dg

def run(negative, dt=np.float64):
    ref, got = sequential(), chunked(negative, dt)
    names = ["o", "S_T", "dq", "dk", "dkt", "dv", "dbeta", "dg"]
    worst = 0.0
    for name, a, b in zip(names, got, ref):
        e = np.abs(a.astype(np.float64) - b).max() / np.abs(b).max()   # a NaN or inf makes e NaN
        worst = max(worst, e) if np.isfinite(e) else np.inf
        print(f"  {name:5s} max rel error {e:.2e}")
    return worst

Q_, K_, KT_, V_, BETA_, G_, DO_, DST_ = problem(-1.0)
print("pkda chunkwise core (blocked per-channel decay) against the sequential recurrence, T=150 dk=8 dv=6")
worst = run(False)
ok = worst <= 1e-12
print(f"{'PASS' if ok else 'FAIL'}: float64, worst {worst:.2e} (bound 1e-12)")
Q_, K_, KT_, V_, BETA_, G_, DO_, DST_ = problem(-4.0)
G_min = min(np.cumsum(G_[c:c + BT], axis=0).min() for c in range(0, T, BT))
with np.errstate(over="ignore"):
    naive = np.exp(np.float32(-G_min))
print(f"strong decays (g in [-4, 0], G down to {G_min:.0f} in a chunk: exp(-G) in float32 = {naive}), the chunked "
      "form in float32")
worst32 = run(False, np.float32)
ok32 = worst32 <= 1e-4
print(f"{'PASS' if ok32 else 'FAIL'}: float32, worst {worst32:.2e} (bound 1e-4)")
ok = ok and ok32
if "--negative" in sys.argv:
    Q_, K_, KT_, V_, BETA_, G_, DO_, DST_ = problem(-1.0)
    print("negative control: the chunk-end state terms left out of dG")
    caught = run(True) > 1e-12
    print(f"{'PASS' if caught else 'FAIL'} negative control: {'caught' if caught else 'not caught'}")
    ok = ok and caught
sys.exit(0 if ok else 1)
