/*
dev/cuda/pdn_recurrent_backward.cuh: the exact reverse-time backward of the pdn / pgdn / pkda core (spec/pdn.md
2.2-2.3), one CTA per (sequence, head), from the states that kernels/pdn.cuh's pdn_core_forward checkpoints every
PDN_CHECKPOINT tokens (its Sck argument). It was the trainer's backward for pkda until the chunk kernels took a
per-channel decay; it stays as version 1 of dev/cuda/pdn_core.cu and as the reference of the chunkwise core on the
CPU emulator (dev/emu/pdn_chunk.cu). Include it after kernels/pdn.cuh.
*/
#ifndef TRAIN_KLA_DEV_CUDA_PDN_RECURRENT_BACKWARD_CUH
#define TRAIN_KLA_DEV_CUDA_PDN_RECURRENT_BACKWARD_CUH

// the core backward (spec 2.2 + 2.3), grid B*H, block PDN_CORE_THREADS: segment by segment from the last, the
// segment's states S_{t0} .. S_{t0+L} are recomputed from its checkpoint into global scratch (transposed,
// [dv][dk], so that the reverse walk's per-channel threads read them coalesced), with the prediction errors p;
// then the tokens are walked in reverse with dL/dS (Dm [dk][dv + 1]) in shared memory:
//   Dm += (s q) dO^T;  dq = s S_t dO;  dk~ = beta Dm p;  du = Dm^T (m k);  dbeta = du.p;  dv = beta du
//   dk = -exp(g) S_{t-1} (beta du);  Dm -= k (beta du)^T;  dg = exp(g) rowsum(Dm * S_{t-1});  Dm *= exp(g)
//   preconditioner: dk += m dk~; dr = -ln(x) m dk~ k / (1 + |r|)^2; dc -= dr; dA = dr / (A + eps) + carry;
//   dgP = sum dA (A - bP k^2); dbP = sum dA k^2; dk += 2 bP k dA; carry = exp(gP) dA
// The per-token sums over channels (dbeta, dgP, dbP) and the dc sum over the CTA run in a fixed order.
// Outputs: dqkv [BT, D] fp32 (overwritten), dbeta, dgP, dbP [BT, H], dg [BT, HK], dcs [B*H] (per (b, h) dL/dc).

// per-CTA global scratch: the CK+1 states of a segment and its CK prediction errors
static size_t pdn_core_backward_scratch_floats(int B, int H, int dk, int dv) {
    return (size_t)B * H * ((size_t)(PDN_CHECKPOINT + 1) * dk * dv + (size_t)PDN_CHECKPOINT * dv);
}

static size_t pdn_core_backward_smem(int dk, int dv) {
    return (2 * (size_t)dk * (dv + 1) + 9 * (size_t)dk + 3 * (size_t)dv + PDN_CORE_THREADS) * sizeof(float);
}

__global__ void pdn_core_backward_kernel(float* dqkv, float* dbeta, float* dg, float* dgP, float* dbP, float* dcs,
                                         float* scratch, const floatX* dO, const float* Sck, const floatX* qkv,
                                         const float* beta, const float* g, const float* gP, const float* bP,
                                         const float* A, const float* m, const float* cs, int T, int H, int dk,
                                         int dv, float qscale, float lnx, float eps) {
    extern __shared__ float smem[];
    const int ld = dv + 1;
    float* Dm = smem;                // [dk][ld] dL/dS_t
    float* S = Dm + dk * ld;         // [dk][ld] the state during the segment's recomputation
    float* qv = S + dk * ld;         // [dk] each
    float* kv = qv + dk;
    float* mv = kv + dk;
    float* al = mv + dk;
    float* wk = al + dk;             // recomputation: beta m k; reverse walk: m k
    float* ek = wk + dk;             // recomputation: exp(g) k; reverse walk: dk~
    float* carry = ek + dk;          // dL/dA_t flowing from later tokens
    float* red1 = carry + dk;        // per-channel terms of dgP
    float* red2 = red1 + dk;         // per-channel terms of dbP
    float* dOv = red2 + dk;          // [dv] dO of the token
    float* du = dOv + dv;            // [dv] beta du
    float* redb = du + dv;           // [dv] per-column terms of dbeta
    float* redc = redb + dv;         // [PDN_CORE_THREADS] per-thread dc
    const int bh = blockIdx.x, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int D = 2 * H * dk + H * dv, NT = pdn_segments(T), HK = H * dk;
    const size_t dkdv = (size_t)dk * dv;
    float* Sseg = scratch + (size_t)bh * ((size_t)(PDN_CHECKPOINT + 1) * dkdv + (size_t)PDN_CHECKPOINT * dv);
    float* pseg = Sseg + (size_t)(PDN_CHECKPOINT + 1) * dkdv;
    const float c = cs[hh];
    float dc = 0.0f;
    for (int i = tid; i < dk * ld; i += blockDim.x) { Dm[i] = 0.0f; }
    for (int d = tid; d < dk; d += blockDim.x) { carry[d] = 0.0f; }
    for (int n = NT - 1; n >= 0; n--) {
        const int t0 = n * PDN_CHECKPOINT;
        const int L = min(T - t0, PDN_CHECKPOINT);
        const size_t r0 = (size_t)b * T + t0;
        // recompute the segment: S_{t0+i} into Sseg[i] ([dv][dk]), p into pseg[i]
        const float* ck = Sck + ((size_t)bh * NT + n) * dkdv;
        for (int i = tid; i < dk * dv; i += blockDim.x) { S[(i / dv) * ld + i % dv] = ck[i]; }
        __syncthreads();
        for (int i = tid; i < dk * dv; i += blockDim.x) { Sseg[i] = S[(i % dk) * ld + i / dk]; }
        for (int i = 0; i < L; i++) {
            const size_t r = r0 + i, e = r * H + hh;
            const floatX* row = qkv + r * D;
            const float bt = beta[e];
            for (int d = tid; d < dk; d += blockDim.x) {
                const float kd = to_float(row[H * dk + hh * dk + d]);
                const float ad = expf(g[e * dk + d]);
                al[d] = ad;
                ek[d] = ad * kd;
                wk[d] = bt * m[e * dk + d] * kd;
            }
            __syncthreads();
            for (int j = tid; j < dv; j += blockDim.x) {
                float p = to_float(row[2 * H * dk + hh * dv + j]);
                for (int d = 0; d < dk; d++) { p -= ek[d] * S[d * ld + j]; }
                for (int d = 0; d < dk; d++) { S[d * ld + j] = al[d] * S[d * ld + j] + wk[d] * p; }
                pseg[(size_t)i * dv + j] = p;
            }
            __syncthreads();
            float* dst = Sseg + (size_t)(i + 1) * dkdv;
            for (int idx = tid; idx < dk * dv; idx += blockDim.x) { dst[idx] = S[(idx % dk) * ld + idx / dk]; }
        }
        __syncthreads();
        // the reverse walk over the segment
        for (int i = L - 1; i >= 0; i--) {
            const size_t r = r0 + i, e = r * H + hh;
            const floatX* row = qkv + r * D;
            const float* St = Sseg + (size_t)(i + 1) * dkdv;   // S_t, [dv][dk]
            const float* Sp = Sseg + (size_t)i * dkdv;         // S_{t-1}
            const float* pt = pseg + (size_t)i * dv;
            const float bt = beta[e];
            for (int d = tid; d < dk; d += blockDim.x) {
                const float kd = to_float(row[H * dk + hh * dk + d]);
                qv[d] = to_float(row[hh * dk + d]);
                kv[d] = kd;
                mv[d] = m[e * dk + d];
                al[d] = expf(g[e * dk + d]);
                wk[d] = mv[d] * kd;
            }
            for (int j = tid; j < dv; j += blockDim.x) { dOv[j] = to_float(dO[e * dv + j]); }
            __syncthreads();
            // per channel d: Dm += (s q) dO^T; dq = s S_t dO; dk~ = beta Dm p
            for (int d = tid; d < dk; d += blockDim.x) {
                const float sq = qscale * qv[d];
                float aq = 0.0f, ak = 0.0f;
                for (int j = 0; j < dv; j++) {
                    const float x = Dm[d * ld + j] + sq * dOv[j];
                    Dm[d * ld + j] = x;
                    aq += St[(size_t)j * dk + d] * dOv[j];
                    ak += x * pt[j];
                }
                dqkv[r * D + hh * dk + d] = qscale * aq;
                ek[d] = bt * ak;
            }
            __syncthreads();
            // per column j: du = Dm^T (m k); dbeta terms du p; dv = beta du
            for (int j = tid; j < dv; j += blockDim.x) {
                float u = 0.0f;
                for (int d = 0; d < dk; d++) { u += wk[d] * Dm[d * ld + j]; }
                redb[j] = u * pt[j];
                du[j] = bt * u;
                dqkv[r * D + 2 * HK + hh * dv + j] = bt * u;
            }
            __syncthreads();
            if (tid == 0) {
                float s = 0.0f;
                for (int j = 0; j < dv; j++) { s += redb[j]; }
                dbeta[e] = s;
            }
            // per channel d: the read path, dg, then the preconditioner (spec 2.3)
            const float bpt = bP[e], egP = expf(gP[e]);
            for (int d = tid; d < dk; d += blockDim.x) {
                const float a = al[d], kd = kv[d], md = mv[d];
                float ad = 0.0f, ag = 0.0f;
                for (int j = 0; j < dv; j++) { ad += Sp[(size_t)j * dk + d] * du[j]; }
                for (int j = 0; j < dv; j++) {
                    const float x = Dm[d * ld + j] - kd * du[j];
                    ag += x * Sp[(size_t)j * dk + d];
                    Dm[d * ld + j] = a * x;
                }
                dg[e * dk + d] = a * ag;
                const float dkt = ek[d];
                float dkd = -a * ad + dkt * md;
                const float At = A[e * dk + d];
                const float dr = pdn_precond_dr(dkt, md, kd, At, c, lnx, eps);
                dc -= dr;
                const float dAtot = dr / (At + eps) + carry[d];
                const float kk = kd * kd;
                red1[d] = dAtot * (At - bpt * kk);
                red2[d] = dAtot * kk;
                dkd += 2.0f * bpt * kd * dAtot;
                carry[d] = egP * dAtot;
                dqkv[r * D + HK + hh * dk + d] = dkd;
            }
            __syncthreads();
            if (tid == 0) {
                float s1 = 0.0f, s2 = 0.0f;
                for (int d = 0; d < dk; d++) { s1 += red1[d]; s2 += red2[d]; }
                dgP[e] = s1;
                dbP[e] = s2;
            }
        }
        __syncthreads();
    }
    redc[tid] = dc;
    __syncthreads();
    if (tid == 0) {
        float s = 0.0f;
        for (int i = 0; i < (int)blockDim.x; i++) { s += redc[i]; }
        dcs[bh] = s;
    }
}

// dcs: [B*H] floats of scratch; core_scratch: pdn_core_backward_scratch_floats(B, H, dk, dv) floats
static void pdn_core_backward(float* dqkv, float* dbeta, float* dg, float* dgP, float* dbP, float* dlog_scale,
                              float* dcs, float* core_scratch, const floatX* dO, const float* Sck, const floatX* qkv,
                              const float* beta, const float* g, const float* gP, const float* bP, const float* A,
                              const float* m, const float* cs, int B, int T, int H, int dk, int dv, float qscale,
                              float lnx, float eps, cudaStream_t stream) {
    const size_t smem = pdn_core_backward_smem(dk, dv);
    cudaCheck(cudaFuncSetAttribute(pdn_core_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    pdn_core_backward_kernel<<<B * H, PDN_CORE_THREADS, smem, stream>>>(dqkv, dbeta, dg, dgP, dbP, dcs, core_scratch,
                                                                        dO, Sck, qkv, beta, g, gP, bP, A, m, cs, T,
                                                                        H, dk, dv, qscale, lnx, eps);
    cudaCheckLaunch();
    pdn_log_scale_grad_kernel<<<ceil_div(H, 32), 32, 0, stream>>>(dlog_scale, dcs, B, H, 1);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_DEV_CUDA_PDN_RECURRENT_BACKWARD_CUH
