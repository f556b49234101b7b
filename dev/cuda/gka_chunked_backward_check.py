"""
gka_chunked_backward_check.py: the algorithm of dev/cuda/gka_core.cu's version 4 (kernels/gka.cuh's backward passes
2, 3a, 3b and the dg scan, spec 5.2), transliterated operation for operation from the kernels into numpy in float64,
against spec 3.2's sequential backward on a small problem (T = 150: two full chunks of 64 and a partial one, dk = 8,
dv = 6, decays with a near-1 stretch). A CPU companion of the lab: it checks the kernels' formulas, masks, per-chunk
scalars and state terms, not their CUDA (tiles, synchronisation), which only the lab on a GPU checks.
Run: python3 dev/cuda/gka_chunked_backward_check.py   (exit 1 when an error exceeds 1e-12; measured ~2e-14)
      python3 dev/cuda/gka_chunked_backward_check.py --negative   (drops Zend^T from the cross-chunk term: must fail)
"""
import sys
import numpy as np
rng = np.random.default_rng(1)
T, D, DV, BT, a, r = 150, 8, 6, 64, 0.02, 30
s = D ** -0.5
def unit(x): return x / np.linalg.norm(x, axis=-1, keepdims=True)
qh = unit(rng.standard_normal((T, D)))
beta = rng.uniform(0.05, 0.95, T)
k = (beta + 1e-6)[:, None] * unit(rng.standard_normal((T, D)))
v = (beta + 1e-6)[:, None] * rng.uniform(-1, 1, (T, DV))
alpha = rng.uniform(0.05, 0.95, T)
g = rng.uniform(-1, 0, T); g[T//3:2*T//3] = rng.uniform(-1e-3, 0, 2*T//3 - T//3)
dO = rng.uniform(-1, 1, (T, DV))
rho = 1 / (1 + 2 * a); rho4 = rho * rho / 4
def cheb(Hm, f, b):
    tau = 2 / (f * (1 + 2 * a)); xp = np.zeros_like(b); x = tau * b; om = 2.0
    for _ in range(r):
        om = 1 / (1 - rho4 * om)
        y = tau * om * (Hm @ x + a * f * x - b) + (om - 1) * xp
        xp = x; x = om * x - y
    return x
# forward
Hs, Us, xs, fs = [], [], np.zeros((T, D)), np.zeros(T)
Hm = np.zeros((D, D)); Um = np.zeros((D, DV))
for t in range(T):
    gm = np.exp(g[t]); Hm = gm * Hm + np.outer(k[t], k[t]); Um = gm * Um + np.outer(k[t], v[t])
    Hs.append(Hm.copy()); Us.append(Um.copy())
    fs[t] = np.linalg.norm(Hm); xs[t] = cheb(Hm, fs[t], qh[t])
qt = qh + alpha[:, None] * (xs - qh)
# sequential backward (spec 3.2)
DH = np.zeros((D, D)); DU = np.zeros((D, DV))
dq_ref, dk_ref, dv_ref, da_ref, dg_ref = np.zeros((T, D)), np.zeros((T, D)), np.zeros((T, DV)), np.zeros(T), np.zeros(T)
dQt, Z = np.zeros((T, D)), np.zeros((T, D))
for t in range(T - 1, -1, -1):
    dqt = s * Us[t] @ dO[t]; dQt[t] = dqt
    DU = DU + s * np.outer(qt[t], dO[t])
    da_ref[t] = dqt @ (xs[t] - qh[t])
    z = cheb(Hs[t], fs[t], alpha[t] * dqt); Z[t] = z
    dq_ref[t] = (1 - alpha[t]) * dqt + z
    w = 2 * a * (xs[t] @ z) / fs[t]
    DH = DH - np.outer(z, xs[t]) - (w / 2) * Hs[t]
    dk_ref[t] = (DH + DH.T) @ k[t] + DU @ v[t]
    dv_ref[t] = DU.T @ k[t]
    Hp = Hs[t - 1] if t > 0 else np.zeros((D, D)); Up = Us[t - 1] if t > 0 else np.zeros((D, DV))
    gm = np.exp(g[t])
    dg_ref[t] = gm * (np.sum(DH * Hp) + np.sum(DU * Up))
    DH = gm * DH; DU = gm * DU
# ---- the kernels' chunked passes, as written
NT = (T + BT - 1) // BT
def chunk(n, arr, width):
    out = np.zeros((BT, width)); L = min(BT, T - n * BT); out[:L] = arr[n * BT:n * BT + L]; return out, L
w_all = np.where(fs > 0, 2 * a * np.sum(xs * Z, axis=1) / fs, 0.0)
Hck = [np.zeros((D, D))]
for n in range(1, NT): Hck.append(Hs[n * BT - 1])
def scalars(n):
    L = min(BT, T - n * BT)
    gc = np.zeros(BT); gc[:L] = g[n * BT:n * BT + L]
    gl = np.cumsum(gc); zeta = np.exp(gl)
    ws = np.zeros(BT); ws[:L] = w_all[n * BT:n * BT + L]
    bsum = np.array([sum(np.exp(gl[c] - gl[j]) * zeta[c] * ws[c] for c in range(j, BT)) for j in range(BT)])
    Wsum = np.array([sum(ws[c] * np.exp(2 * (gl[c] - gl[j])) for c in range(j, BT)) for j in range(BT)])
    e = np.exp(gl[BT - 1] - gl); coef = np.sum(zeta * zeta * ws)
    return gl, zeta, ws, bsum, Wsum, e, coef, zeta[BT - 1], L
# pass 2
adjZ, adjB, adjU = [None] * NT, [None] * NT, [None] * NT
SZ, SB, SU = np.zeros((D, D)), np.zeros((D, D)), np.zeros((D, DV))
for n in range(NT - 1, -1, -1):
    adjZ[n], adjB[n], adjU[n] = SZ.copy(), SB.copy(), SU.copy()
    if n == 0: break
    gl, zeta, ws, bsum, Wsum, e, coef, zb, L = scalars(n)
    Zc, _ = chunk(n, Z, D); Xc, _ = chunk(n, xs, D); Kc, _ = chunk(n, k, D); Qc, _ = chunk(n, qt, D); Dc, _ = chunk(n, dO, DV)
    SZ = zb * SZ + (zeta[:, None] * Zc).T @ Xc
    SB = zb * SB + (bsum[:, None] * Kc).T @ Kc + coef * Hck[n]
    SU = zb * SU + (s * zeta[:, None] * Qc).T @ Dc
# pass 3a and 3b
dq, dk, dv, da, dG = np.zeros((T, D)), np.zeros((T, D)), np.zeros((T, DV)), np.zeros(T), np.zeros(T)
for n in range(NT):
    gl, zeta, ws, bsum, Wsum, e, coef, zb, L = scalars(n)
    Kc, _ = chunk(n, k, D); Xc, _ = chunk(n, xs, D); Zc, _ = chunk(n, Z, D); Vc, _ = chunk(n, v, DV)
    Qc, _ = chunk(n, qt, D); Dc, _ = chunk(n, dO, DV); dQc, _ = chunk(n, dQt, D); fc = np.zeros(BT); fc[:L] = fs[n*BT:n*BT+L]
    H0 = Hck[n]
    M = np.array([[np.exp(gl[c] - gl[j]) if j <= c else 0.0 for j in range(BT)] for c in range(BT)])
    MT = np.array([[np.exp(gl[j] - gl[c]) if j >= c else 0.0 for j in range(BT)] for c in range(BT)])
    # 3a
    P = zeta[:, None] * (Xc @ H0) + ((Xc @ Kc.T) * M) @ Kc
    zhx = np.sum(Zc * P, axis=1)
    P = ((Kc @ Xc.T) * MT) @ Zc
    P += ((Kc @ Zc.T) * MT) @ Xc
    S = Kc @ Kc.T
    Mw = np.array([[np.exp(gl[max(c, j)] - gl[min(c, j)]) * Wsum[max(c, j)] for j in range(BT)] for c in range(BT)])
    P += (S * Mw) @ Kc
    P += (bsum[:, None] * Kc) @ H0
    Send = adjZ[n] + adjB[n] if '--negative' in sys.argv else adjZ[n] + adjZ[n].T + adjB[n]
    P += (e[:, None] * Kc) @ Send
    khk = np.sum(Kc * P, axis=1)
    dKH = -P
    dGc = -zhx - 0.5 * ws * fc * fc + 0.5 * khk
    # 3b
    Pv = e[:, None] * (Kc @ adjU[n]) + ((Kc @ Qc.T) * MT * s) @ Dc
    S = (Vc @ Dc.T) * MT * s
    dKU = e[:, None] * (Vc @ adjU[n].T) + S @ Qc
    qdq = np.sum(Qc * dQc, axis=1); kdk = np.sum(Kc * dKU, axis=1)
    dGc = dGc + qdq - kdk
    sl = slice(n * BT, n * BT + L)
    dv[sl] = Pv[:L]; dk[sl] = (dKH + dKU)[:L]; dq[sl] = ((1 - alpha[sl])[:, None] * dQt[sl] + Z[sl])
    da[sl] = np.sum(dQt[sl] * (xs[sl] - qh[sl]), axis=1); dG[sl] = dGc[:L]
dg = np.cumsum(dG[::-1])[::-1]
worst = 0.0
for name, got, ref in [("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref), ("dalpha", da, da_ref), ("dg", dg, dg_ref)]:
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    worst = max(worst, err)
    print(f"{name:7s} rel err {err:.3e}")
print("PASS" if worst <= 1e-12 else "FAIL", f"worst {worst:.3e} (tol 1e-12)")
sys.exit(0 if worst <= 1e-12 else 1)
