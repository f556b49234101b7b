/*
Kernel lab for the core of the pdn / pgdn / pkda layer (spec/pdn.md 2.1-2.3, 3): the forward and backward of each
version, checked against a CPU reference in double precision, then timed.

Compile and run from dev/cuda:
nvcc -O3 -arch=sm_90 -std=c++17 -I../.. pdn_core.cu -o pdn_core_bin
nvcc -O3 -arch=sm_90 -std=c++17 -I../.. -DENABLE_FP32 pdn_core.cu -o pdn_core_fp32_bin
./pdn_core_bin 2        (the argument picks the version that is checked and timed; default 2)
./pdn_core_bin 2 pkda   (times pkda alone, without the checks: for profilers such as ncu; pgdn likewise)

version 1 is kernels/pdn.cuh: the sequential recurrence, one CTA per (sequence, head) walking the tokens in order
with the fp32 state S [dk, dv] and the preconditioner state A [dk] in shared memory; the backward recomputes each
64-token segment's states from the forward's checkpoints into global scratch and walks it in reverse. The trainer
decodes with its forward. Measured on an H200 (2026-11-24, B=16 T=2048 H=6 dk=dv=128, pkda): forward 13.8 ms,
backward 106.2 ms.
version 2 is the chunkwise form of spec 3, what the trainer runs: the preconditioner scan on 64-token chunks, one
thread per (sequence, head, chunk, key channel) (pdn_precond_forward, spec 3.3), then kernels/gdn_chunk.cuh's chunk
kernels (tensor cores in the bf16 build) along the write key k~ = m k, with a scalar decay per token and head (pdn,
pgdn) or pkda's per-channel decay (GDN_DECAY_CHANNEL: the intra-chunk products on 16-row blocks, spec/pdn.md 3.2);
the backward is gdn_chunk_backward, which returns the read key's and k~'s gradients apart, then the scan's reverse
walk, chunked the same way (pdn_precond_backward, spec 2.3).

The reference is spec 2.1 (forward) and the reverse-time recurrences of 2.2-2.3 (backward) in double, with every
state kept, fed exactly the inputs the GPU sees (floatX inputs rounded first). Inputs are shaped as in the layer:
q, k unit vectors per head, beta, bP in (0, 1), log decays gP in [-1, 0] and g: pgdn-like one per head in
[-1, 0]; pkda-like one per channel, channel d's in [-s_d, 0] with s_d log-spaced from 0.01 to 4 (in the strongest
channels a chunk decays by about exp(-128), beyond fp32's exp range); pdn: 0. Checks: relative L2 error per output
(pgdn: dg per (token, head), the reference's channels summed). Tolerance 1e-4 in the fp32 build (fp32 rounding grown through recurrences of a few
hundred tokens and the preconditioner's log/exp); in the bf16 build 1e-2 for version 1, where o is stored in bf16
(relative error up to 2^-9 per element; the backward's outputs are fp32 and see the same inputs as the reference),
and 2e-2 for version 2, whose chunk products also round their operands (k~, Tm, W, Vn, h, ...) to bf16: the
bound of the gdn chunk labs (dev/cuda/gdn_chunk_bwd.cu says why). Exit status 1 if any check fails.
*/
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include "../../kernels/pdn.cuh"
#include "pdn_recurrent_backward.cuh"

#include "../../kernels/gdn_chunk.cuh"

#if defined(ENABLE_FP32)
static double TOLERANCE = 1e-4;
#else
static double TOLERANCE = 1e-2;   // version 2's kernels: 2e-2 (set per validation)
#endif
#include "lab_common.cuh"   // after TOLERANCE


// ----------------------------------------------------------------------------------------------------------
// the inputs of the core, shaped as in the layer

struct CoreInputs {
    int B, T, H, dk, dv;
    std::vector<float> qkv, beta, g, gP, bP, cs, dO;   // [BT, D], [BT, H] x1, [BT, HK], [BT, H] x2, [H], [BT, HV]
};

// decay: 0 none (pdn), 1 one log decay per head (pgdn), 2 one per channel (pkda)
static CoreInputs make_inputs(int B, int T, int H, int dk, int dv, int decay) {
    CoreInputs in;
    in.B = B; in.T = T; in.H = H; in.dk = dk; in.dv = dv;
    const size_t BT = (size_t)B * T;
    const int D = 2 * H * dk + H * dv;
    in.qkv = random_vector(BT * D, -1.0f, 1.0f);
    for (size_t r = 0; r < BT; r++) {   // unit q and k per head, as after the layer's l2 norms
        for (int blk = 0; blk < 2 * H; blk++) {
            float* u = &in.qkv[r * D + (size_t)blk * dk];
            double s = 0.0;
            for (int d = 0; d < dk; d++) { s += (double)u[d] * u[d]; }
            for (int d = 0; d < dk; d++) { u[d] = (float)(u[d] / sqrt(s + 1e-6)); }
        }
    }
    in.beta = random_vector(BT * H, 0.05f, 0.95f);
    in.gP = random_vector(BT * H, -1.0f, 0.0f);
    in.bP = random_vector(BT * H, 0.05f, 0.95f);
    in.g.assign(BT * H * dk, 0.0f);
    for (size_t e = 0; e < BT * H; e++) {
        const float gs = rand_uniform(-1.0f, 0.0f);
        for (int d = 0; d < dk; d++) {
            const float sd = 0.01f * powf(400.0f, (float)d / (float)(dk - 1));
            in.g[e * dk + d] = decay == 0 ? 0.0f : decay == 1 ? gs : sd * rand_uniform(-1.0f, 0.0f);
        }
    }
    in.cs = random_vector(H, -3.0f, -1.0f);
    in.dO = random_vector(BT * H * dv, -1.0f, 1.0f);
    return in;
}

// ----------------------------------------------------------------------------------------------------------
// the double-precision reference: spec 2.1 forward with every state kept, then 2.2-2.3 in reverse

struct CoreReference {
    std::vector<double> o, A, m, dq, dk, dv, dbeta, dg, dgP, dbP, dcs;
};

static CoreReference reference(const CoreInputs& in, double lnx, double eps) {
    const int B = in.B, T = in.T, H = in.H, dk = in.dk, dv = in.dv;
    const int D = 2 * H * dk + H * dv, HK = H * dk, HV = H * dv;
    const size_t BT = (size_t)B * T;
    const double qs = 1.0 / sqrt((double)dk);
    CoreReference R;
    R.o.assign(BT * HV, 0.0); R.A.assign(BT * HK, 0.0); R.m.assign(BT * HK, 0.0);
    R.dq.assign(BT * HK, 0.0); R.dk.assign(BT * HK, 0.0); R.dv.assign(BT * HV, 0.0);
    R.dbeta.assign(BT * H, 0.0); R.dg.assign(BT * HK, 0.0); R.dgP.assign(BT * H, 0.0); R.dbP.assign(BT * H, 0.0);
    R.dcs.assign(H, 0.0);
    const size_t dkdv = (size_t)dk * dv;
    for (int b = 0; b < B; b++) {
        for (int hh = 0; hh < H; hh++) {
            std::vector<double> S((size_t)(T + 1) * dkdv, 0.0), P((size_t)T * dv), A(dk, 0.0);
            for (int t = 0; t < T; t++) {
                const size_t r = (size_t)b * T + t, e = r * H + hh;
                const float* q = &in.qkv[r * D + hh * dk];
                const float* k = &in.qkv[r * D + HK + hh * dk];
                const float* v = &in.qkv[r * D + 2 * HK + hh * dv];
                for (int d = 0; d < dk; d++) {
                    A[d] = exp((double)in.gP[e]) * A[d] + in.bP[e] * (double)k[d] * k[d];
                    const double rr = log(A[d] + eps) - in.cs[hh];
                    R.A[e * dk + d] = A[d];
                    R.m[e * dk + d] = exp(-lnx * rr / (1.0 + fabs(rr)));
                }
                const double* Sp = &S[(size_t)t * dkdv];
                double* St = &S[(size_t)(t + 1) * dkdv];
                for (int j = 0; j < dv; j++) {
                    double p = v[j];
                    for (int d = 0; d < dk; d++) { p -= exp((double)in.g[e * dk + d]) * k[d] * Sp[d * dv + j]; }
                    P[(size_t)t * dv + j] = p;
                    double o = 0.0;
                    for (int d = 0; d < dk; d++) {
                        St[d * dv + j] = exp((double)in.g[e * dk + d]) * Sp[d * dv + j]
                                       + in.beta[e] * R.m[e * dk + d] * k[d] * p;
                        o += q[d] * St[d * dv + j];
                    }
                    R.o[e * dv + j] = qs * o;
                }
            }
            std::vector<double> Dm(dkdv, 0.0), carry(dk, 0.0), du(dv), dkt(dk);
            for (int t = T - 1; t >= 0; t--) {
                const size_t r = (size_t)b * T + t, e = r * H + hh;
                const float* q = &in.qkv[r * D + hh * dk];
                const float* k = &in.qkv[r * D + HK + hh * dk];
                const float* dO = &in.dO[e * dv];
                const double* Sp = &S[(size_t)t * dkdv];
                const double* St = &S[(size_t)(t + 1) * dkdv];
                const double* p = &P[(size_t)t * dv];
                const double bt = in.beta[e];
                for (int d = 0; d < dk; d++) {
                    double aq = 0.0, ak = 0.0;
                    for (int j = 0; j < dv; j++) {
                        Dm[d * dv + j] += qs * q[d] * dO[j];
                        aq += St[d * dv + j] * dO[j];
                        ak += Dm[d * dv + j] * p[j];
                    }
                    R.dq[e * dk + d] = qs * aq;
                    dkt[d] = bt * ak;
                }
                double db = 0.0;
                for (int j = 0; j < dv; j++) {
                    double u = 0.0;
                    for (int d = 0; d < dk; d++) { u += R.m[e * dk + d] * k[d] * Dm[d * dv + j]; }
                    db += u * p[j];
                    du[j] = bt * u;
                    R.dv[e * dv + j] = bt * u;
                }
                R.dbeta[e] = db;
                double sgP = 0.0, sbP = 0.0;
                for (int d = 0; d < dk; d++) {
                    const double al = exp((double)in.g[e * dk + d]), md = R.m[e * dk + d], At = R.A[e * dk + d];
                    double ad = 0.0, ag = 0.0;
                    for (int j = 0; j < dv; j++) {
                        ad += Sp[d * dv + j] * du[j];
                        Dm[d * dv + j] -= k[d] * du[j];
                        ag += Dm[d * dv + j] * Sp[d * dv + j];
                        Dm[d * dv + j] *= al;
                    }
                    R.dg[e * dk + d] = al * ag;
                    double dkd = -al * ad + dkt[d] * md;
                    const double rr = log(At + eps) - in.cs[hh];
                    const double dr = -lnx * md * dkt[d] * k[d] / ((1.0 + fabs(rr)) * (1.0 + fabs(rr)));
                    R.dcs[hh] -= dr;
                    const double dA = dr / (At + eps) + carry[d];
                    sgP += dA * (At - in.bP[e] * (double)k[d] * k[d]);
                    sbP += dA * (double)k[d] * k[d];
                    dkd += 2.0 * in.bP[e] * k[d] * dA;
                    carry[d] = exp((double)in.gP[e]) * dA;
                    R.dk[e * dk + d] = dkd;
                }
                R.dgP[e] = sgP;
                R.dbP[e] = sbP;
            }
        }
    }
    return R;
}

// ----------------------------------------------------------------------------------------------------------
// the GPU side: buffers, one forward + backward

struct CoreDevice {
    floatX *qkv, *o, *dO, *kt;
    float *beta, *g, *gP, *bP, *cs, *A, *m, *Sck, *dqkv, *dbeta, *dg, *dgP, *dbP, *dlog_scale, *dcs, *scratch;
    float *dkt;           // version 2: dL/dk~
    void *saved, *work;   // version 2: the chunk kernels' saved tensors and workspace
};

static CoreDevice upload(CoreInputs& in) {
    const size_t BT = (size_t)in.B * in.T;
    const int H = in.H, D = 2 * H * in.dk + H * in.dv, HK = H * in.dk, HV = H * in.dv;
    CoreDevice d;
    d.qkv = upload_floatX(in.qkv);
    d.dO = upload_floatX(in.dO);
    d.beta = upload_f32(in.beta);
    d.g = upload_f32(in.g);
    d.gP = upload_f32(in.gP);
    d.bP = upload_f32(in.bP);
    d.cs = upload_f32(in.cs);
    d.o = (floatX*)cuda_malloc_or_die(BT * HV * sizeof(floatX), "o");
    d.A = (float*)cuda_malloc_or_die(BT * HK * sizeof(float), "A");
    d.m = (float*)cuda_malloc_or_die(BT * HK * sizeof(float), "m");
    d.Sck = (float*)cuda_malloc_or_die((size_t)in.B * H * pdn_segments(in.T) * in.dk * in.dv * sizeof(float), "Sck");
    d.dqkv = (float*)cuda_malloc_or_die(BT * D * sizeof(float), "dqkv");
    d.dbeta = (float*)cuda_malloc_or_die(BT * H * sizeof(float), "dbeta");
    d.dg = (float*)cuda_malloc_or_die(BT * HK * sizeof(float), "dg");
    d.dgP = (float*)cuda_malloc_or_die(BT * H * sizeof(float), "dgP");
    d.dbP = (float*)cuda_malloc_or_die(BT * H * sizeof(float), "dbP");
    d.dlog_scale = (float*)cuda_malloc_or_die(H * sizeof(float), "dlog_scale");
    d.dcs = (float*)cuda_malloc_or_die((size_t)in.B * H * pdn_precond_chunks(in.T) * sizeof(float), "dcs");
    d.scratch = (float*)cuda_malloc_or_die(pdn_core_backward_scratch_floats(in.B, H, in.dk, in.dv) * sizeof(float),
                                           "core scratch");
    d.kt = (floatX*)cuda_malloc_or_die(BT * HK * sizeof(floatX), "kt");
    d.dkt = (float*)cuda_malloc_or_die(BT * HK * sizeof(float), "dkt");
    // the per-channel layout is the larger one: it serves both decay kinds
    d.saved = cuda_malloc_or_die(gdn_chunk_saved_bytes(in.B, in.T, H, in.dk, in.dv, GDN_DECAY_CHANNEL), "chunk saved");
    const size_t work_bytes = gdn_chunk_workspace_bytes(in.B, in.T, H, in.dk, in.dv, GDN_DECAY_CHANNEL);
    const size_t scan_bytes = pdn_precond_scratch_bytes(in.B, in.T, H, in.dk);
    d.work = cuda_malloc_or_die(work_bytes > scan_bytes ? work_bytes : scan_bytes, "chunk workspace");
    cudaCheck(cudaMemset(d.dlog_scale, 0, H * sizeof(float)));
    return d;
}

static void release(CoreDevice& d) {
    for (void* p : std::vector<void*>{d.qkv, d.o, d.dO, d.beta, d.g, d.gP, d.bP, d.cs, d.A, d.m, d.Sck, d.dqkv,
                                      d.dbeta, d.dg, d.dgP, d.dbP, d.dlog_scale, d.dcs, d.scratch, d.kt, d.dkt,
                                      d.saved, d.work}) {
        cudaCheck(cudaFree(p));
    }
}

static int version = 2;   // the version picked on the command line

// version 2's chunk kernels read pgdn's decay of (token, head) from channel 0 of g (g_stride = dk) and write its
// dg per (token, head) into d.dg's first B*T*H floats; pkda's g and dg are per channel
static GdnDecay decay_kind(int decay) { return decay == 2 ? GDN_DECAY_CHANNEL : GDN_DECAY_HEAD; }

// marks (version 2, optional): events recorded after the preconditioner scan and after each chunk kernel
static void run_forward(const CoreInputs& in, CoreDevice& d, int decay, float lnx, float eps,
                        cudaEvent_t* marks = nullptr) {
    const float qscale = 1.0f / sqrtf((float)in.dk);
    if (version == 1) {
        pdn_core_forward(d.o, d.A, d.m, d.Sck, NULL, NULL, d.qkv, d.beta, d.g, d.gP, d.bP, d.cs, in.B, in.T, in.H,
                         in.dk, in.dv, qscale, lnx, eps, 0);
        return;
    }
    const int D = 2 * in.H * in.dk + in.H * in.dv, HK = in.H * in.dk, HV = in.H * in.dv;
    pdn_precond_forward(d.A, d.m, d.kt, d.work, d.qkv, d.gP, d.bP, d.cs, in.B, in.T, in.H, in.dk, in.dv, lnx, eps, 0);
    if (marks) { cudaCheck(cudaEventRecord(marks[0])); }
    gdn_chunk_forward_impl<floatX, floatX>(d.o, HV, d.saved, d.work, d.qkv, d.qkv + HK, d.qkv + 2 * HK, D, d.kt, HK,
                                           d.beta, d.g, in.dk, decay_kind(decay), in.B, in.T, in.H, in.dk, in.dv,
                                           qscale, 0, marks ? marks + 1 : nullptr);
}
// marks (version 2, optional): events recorded after each chunk kernel and after the preconditioner's backward
static void run_backward(const CoreInputs& in, CoreDevice& d, int decay, float lnx, float eps,
                         cudaEvent_t* marks = nullptr) {
    const float qscale = 1.0f / sqrtf((float)in.dk);
    if (version == 1) {
        pdn_core_backward(d.dqkv, d.dbeta, d.dg, d.dgP, d.dbP, d.dlog_scale, d.dcs, d.scratch, d.dO, d.Sck, d.qkv,
                          d.beta, d.g, d.gP, d.bP, d.A, d.m, d.cs, in.B, in.T, in.H, in.dk, in.dv, qscale, lnx, eps, 0);
        return;
    }
    const int D = 2 * in.H * in.dk + in.H * in.dv, HK = in.H * in.dk, HV = in.H * in.dv;
    gdn_chunk_backward_impl<floatX, floatX>(d.dqkv, d.dqkv + HK, d.dqkv + 2 * HK, D, d.dkt, HK, d.dbeta, d.dg, d.dO,
                                            HV, d.saved, d.work, d.qkv, d.qkv + HK, d.qkv + 2 * HK, D, d.kt, HK,
                                            d.beta, decay_kind(decay), in.B, in.T, in.H, in.dk, in.dv, qscale, 0,
                                            marks);
    pdn_precond_backward(d.dqkv, d.dgP, d.dbP, d.dlog_scale, d.dcs, d.work, d.dkt, d.qkv, d.A, d.m, d.gP, d.bP, d.cs,
                         in.B, in.T, in.H, in.dk, in.dv, lnx, eps, 0);
    if (marks) { cudaCheck(cudaEventRecord(marks[3])); }
}

// version 2's kernels one by one: the mean time between the marks over iters runs of f(marks)
template <typename F>
static void print_kernel_times(const char* what, const char* const names[4], int iters, F f) {
    cudaEvent_t ev[5];
    for (int i = 0; i < 5; i++) { cudaCheck(cudaEventCreate(&ev[i])); }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int it = 0; it < iters; it++) {
        cudaCheck(cudaEventRecord(ev[0]));
        f(ev + 1);
        cudaCheck(cudaEventSynchronize(ev[4]));
        for (int i = 0; i < 4; i++) {
            float ms = 0.0f;
            cudaCheck(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
            acc[i] += ms / iters;
        }
    }
    printf("  %s per kernel: %s %.3f, %s %.3f, %s %.3f, %s %.3f ms\n", what, names[0], acc[0], names[1], acc[1],
           names[2], acc[2], names[3], acc[3]);
    for (int i = 0; i < 5; i++) { cudaCheck(cudaEventDestroy(ev[i])); }
}


static void validate(int B, int T, int H, int dk, int dv, int decay) {
    const float lnx = logf(1.5f), eps = 1e-6f;
    printf("core B=%d T=%d H=%d dk=%d dv=%d, decay %s\n", B, T, H, dk, dv,
           decay == 0 ? "none (pdn)" : decay == 1 ? "per head (pgdn)" : "per channel (pkda)");
#if !defined(ENABLE_FP32)
    TOLERANCE = version == 2 ? 2e-2 : 1e-2;
#endif
    CoreInputs in = make_inputs(B, T, H, dk, dv, decay);
    CoreDevice d = upload(in);   // rounds qkv and dO to floatX first
    const CoreReference R = reference(in, lnx, eps);
    const size_t BT = (size_t)B * T;
    const int D = 2 * H * dk + H * dv, HK = H * dk, HV = H * dv;
    run_forward(in, d, decay, lnx, eps);
    run_backward(in, d, decay, lnx, eps);
    check("forward o", download_floatX(d.o, BT * HV), R.o);
    check("forward A", download_f32(d.A, BT * HK), R.A);
    check("forward m", download_f32(d.m, BT * HK), R.m);
    const std::vector<float> dqkv = download_f32(d.dqkv, BT * D);
    check("backward dq", columns(dqkv, (int)BT, D, 0, HK), R.dq);
    check("backward dk", columns(dqkv, (int)BT, D, HK, HK), R.dk);
    check("backward dv", columns(dqkv, (int)BT, D, 2 * HK, HV), R.dv);
    check("backward dbeta", download_f32(d.dbeta, BT * H), R.dbeta);
    if (decay == 2 || (decay && version == 1)) { check("backward dg", download_f32(d.dg, BT * HK), R.dg); }
    if (decay == 1 && version == 2) {   // per (token, head): the reference's channels summed
        std::vector<double> dg_head(BT * H, 0.0);
        for (size_t e = 0; e < BT * H; e++) {
            for (int c = 0; c < dk; c++) { dg_head[e] += R.dg[e * dk + c]; }
        }
        check("backward dg", download_f32(d.dg, BT * H), dg_head);
    }
    check("backward dgP", download_f32(d.dgP, BT * H), R.dgP);
    check("backward dbP", download_f32(d.dbP, BT * H), R.dbP);
    check("backward dlog_scale", download_f32(d.dlog_scale, H), R.dcs);
    release(d);
}

// the issue's row is pgdn (the official kernels 0.68 / 2.78 ms forward / both); version 1 is timed on pkda alone
static void benchmark(int B, int T, int H, int dk, int dv, int decay) {
    const float lnx = logf(1.5f), eps = 1e-6f;
    CoreInputs in = make_inputs(B, T, H, dk, dv, decay);
    CoreDevice d = upload(in);
    const float fwd = time_ms(3, [&] { run_forward(in, d, decay, lnx, eps); });
    const float bwd = time_ms(3, [&] { run_backward(in, d, decay, lnx, eps); });
    printf("timing B=%d T=%d H=%d dk=%d dv=%d, %s: forward %.3f ms, backward %.3f ms, forward+backward %.3f ms\n", B, T,
           H, dk, dv, decay == 2 ? "pkda" : "pgdn", fwd, bwd, fwd + bwd);
    if (version == 2) {
        const char* const fwd_names[4] = {"precond scan", "intra", "state", "output"};
        const char* const bwd_names[4] = {"dvlocal", "state", "chunk", "precond scan"};
        print_kernel_times("forward", fwd_names, 5, [&](cudaEvent_t* m) { run_forward(in, d, decay, lnx, eps, m); });
        print_kernel_times("backward", bwd_names, 5, [&](cudaEvent_t* m) { run_backward(in, d, decay, lnx, eps, m); });
    }
    if (decay == 1) {
        printf("  issue 10 targets (pgdn): forward <= 0.68 ms, forward+backward <= 2.78 ms (now %.2fx and %.2fx)\n",
               fwd / 0.68, (fwd + bwd) / 2.78);
    }
    release(d);
}

int main(int argc, char** argv) {
    version = argc > 1 ? atoi(argv[1]) : 2;
    // one mixer's timing alone, without the checks (for profilers)
    const int time_only = argc > 2 ? (strcmp(argv[2], "pkda") == 0 ? 2 : strcmp(argv[2], "pgdn") == 0 ? 1 : -1) : 0;
    if ((version != 1 && version != 2) || time_only < 0) {
        die("usage: %s [version 1 or 2, default 2] [pkda or pgdn: time that mixer only, no checks]", argv[0]);
    }
    if (time_only) {
        benchmark(16, 2048, 6, 128, 128, time_only);
        return 0;
    }
    printf("version %d, precision %s, tolerance %.0e (relative L2; bf16: 1e-2 for version 1's kernels, 2e-2 for "
           "version 2's)\n", version, PRECISION_NAME, TOLERANCE);
    validate(2, 150, 2, 16, 24, 0);     // T not a multiple of the 64-token segments, dk != dv
    validate(2, 150, 2, 16, 24, 1);
    validate(2, 150, 2, 32, 48, 2);
    validate(2, 150, 2, 32, 48, 1);
    validate(1, 130, 2, 128, 128, 2);   // the benchmark's head size (dk * dv > the block's threads)
    validate(1, 130, 2, 128, 128, 1);
    if (version == 2) { benchmark(16, 2048, 6, 128, 128, 1); }
    benchmark(16, 2048, 6, 128, 128, 2);
    if (failures) {
        printf("FAIL: %d check(s) failed\n", failures);
        return 1;
    }
    printf("all checks PASS\n");
    return 0;
}
