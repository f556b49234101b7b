#!/usr/bin/env bash
# dev/emu/run.sh: kernel checks on the CPU emulator (dev/emu/emu.h), no GPU needed, only nvcc for the host compiler.
# Transforms the kernel headers (dev/emu/transform.py), then
#   gka_backward.cu: gka's chunked backward against its recurrent remainder on the lab's shapes (dk, dv = 16, 24
#     and 32, 48 at T = 150; EMU_FULL=1 adds 128, 128 at T = 130, about 10 minutes on 2 cores); negative control:
#     the same kernels with Zend^T left out of pass 3a's cross-chunk term must fail;
#   pdn_chunk.cu: the chunkwise pdn / pgdn / pkda core (preconditioner scan + gdn_chunk kernels along k~) against
#     the recurrent core, same shapes; negative controls: the chunk backward without the column side of A's gradient
#     (dkw += Z1^T K), the preconditioner backward without the carries of the later chunks, pkda's dg without the
#     chunk-end state terms, and the per-channel decayed products without their off-diagonal blocks, must fail;
#   gka_mma.cu: gka's tensor-core kernels (the bf16 trainer's solves on wgmma; readout, dQt, pass 3 and the
#     chunk-state terms of the forward and of pass 2 on mma.sync) against the CUDA-core fp32 products, bf16 build,
#     T = 100 (two chunks), dk, dv = 16, 24 (about 2 minutes: every ldmatrix and mma is a barrier of the warp's 32
#     threads), then with the fp16 solves (version 10), also on wide inputs (half's range), with the mixed solves
#     (version 11), the lean ones (version 12), the solo ones (versions 13 and 14, the fp16 one also on wide
#     inputs) and version 9's (x in two pieces; the trainer's are the incremental form's, version 15); negative controls: the
#     second bf16 piece of x and S left out of version 9's solve's register-operand products (and the fp16 one's, and the
#     solo one's), the solo solve's decay mask, its steps of the n-tiles kept in shared memory, the fp16 solo solve's
#     row scales on the wide inputs, pass 3a's
#     diag(b) K H0 and pass 3b's diag(e) V DUend^T left out, the chunk-state terms' row operand in one bf16 piece,
#     the fp16 solve's row scales left out on the wide inputs, the mixed solve's X H0 in one piece throughout, the
#     incremental form's x advanced by the unrounded step (not the one the products take), must fail;
#   gdn_mma.cu: gdn_chunk's register-tile kernels (the bf16 trainer's state passes, unsplit and split along the
#     sequence, output, dvlocal, the intra
#     kernels per head and per channel, the backward chunk kernels per head and per channel (per channel with the
#     key gradients' Z1 terms fused in); ldmatrix, mma.sync and cp.async emulated)
#     against the fp32 shared-memory kernels, per-head and per-channel decay, bf16 build, at T, dk, dv = 150 24 40,
#     100 136 24 and 70 128 40 (the state passes compiled for dk = 128; about a minute each); negative controls: the backward state pass without dE -= W^T dVn, the output
#     kernel without diag(gam) on Q h_n, the intra kernel without beta in A, the backward chunk kernel without phase
#     2's part of dT, the split state passes' phase 3 from zero or phase 1 without its identity columns, the
#     per-channel intra kernel without the decay of its row blocks' rows or without its
#     per-element diagonal blocks (strong decay), the per-channel backward chunk kernel without the diagonal blocks
#     of rows(dAqk, Kw) and rows(Z1, Kw) per element (strong decay) or on tensor cores (weak decay), or without
#     cols(dAqk, Q) in dkw, must fail;
#   kalman_filter.cu: the kalman filter kernels against the double reference (B, T, Dk, N = 2 150 20 32, 2 150 20 16,
#     1 40 36 5: ragged tiles and channel blocks, idle lanes) with 1, 2 and 5 time segments, and decode == forward
#     bit for bit; negative controls: the backward's second half replayed from the tile's start, the forward
#     without the earlier segments' information maps, the backward without the later segments' carry maps, must fail.
# Exit status 1 if a check or a control fails.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if ! command -v nvcc > /dev/null; then
    echo "PASS emulator: skipped, nvcc not found (it compiles the kernels as host code)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/ok/kernels" "$tmp/neg"
cp kernels/common.cuh kernels/column_sum.cuh kernels/chunk_tiles.cuh kernels/mma.cuh kernels/gka.cuh kernels/pdn.cuh \
    kernels/gdn_chunk.cuh kernels/kalman_scan.cuh dev/cuda/pdn_recurrent_backward.cuh "$tmp/src/"
cp utils.h "$tmp/ok/"
python3 dev/emu/transform.py "$tmp/src" "$tmp/ok/kernels" || exit 1
cp dev/emu/emu.h dev/emu/gka_inputs.h dev/emu/gka_backward.cu dev/emu/gka_mma.cu dev/emu/gdn_mma.cu dev/emu/pdn_chunk.cu \
    dev/emu/kalman_filter.cu dev/cuda/kalman_reference.h \
    "$tmp/ok/"
build() {   # build DIR NAME: the fp32 build, but the register-tile checks' (their kernels are the bf16 build's)
    local precision=FP32
    case $2 in gka_mma | gdn_mma) precision=BF16 ;; esac
    (cd "$1" && nvcc -std=c++20 -O1 -DENABLE_$precision -I. "$2.cu" -o "$2") || { echo "FAIL emulator build of $2"; return 1; }
}
failures=0
shapes=("150 16 24" "150 32 48")
[ "${EMU_FULL:-0}" = 1 ] && shapes+=("130 128 128")
kalman_shapes=("2 150 20 32" "2 150 20 16" "1 40 36 5")
for check in gka_backward gka_mma gdn_mma pdn_chunk kalman_filter; do
    build "$tmp/ok" $check || { failures=$((failures + 1)); continue; }
    case $check in
        kalman_filter) runs=("${kalman_shapes[@]}") ;;
        gka_mma) runs=("100 16 24" "100 16 24 f16" "100 16 24 f16 wide" "100 16 24 mixed" "100 16 24 lean"
                       "100 16 24 solo" "100 16 24 solo16" "100 16 24 solo16 wide" "100 16 24 pieces") ;;
        gdn_mma) runs=("150 24 40" "100 136 24" "70 128 40") ;;
        *) runs=("${shapes[@]}") ;;
    esac
    for shape in "${runs[@]}"; do
        # shellcheck disable=SC2086
        "$tmp/ok/$check" $shape || failures=$((failures + 1))
    done
done
# negative control (file, sed expression, what it drops, check[, its arguments]): the check must fail on the
# changed kernels
negative() {
    rm -rf "$tmp/neg" && mkdir -p "$tmp/neg" && cp -r "$tmp/ok/." "$tmp/neg/"
    sed -i "$2" "$tmp/neg/kernels/$1"
    # shellcheck disable=SC2086
    if cmp -s "$tmp/ok/kernels/$1" "$tmp/neg/kernels/$1"; then
        echo "FAIL negative control ($3): the term to drop was not found"; failures=$((failures + 1))
    elif build "$tmp/neg" "$4" > /dev/null 2>&1 && ! "$tmp/neg/$4" ${5:-150 16 24} > "$tmp/neg.out"; then
        echo "PASS negative control: without $3 the check fails ($(grep -m1 -o 'FAIL.*' "$tmp/neg.out" | head -c 60))"
    else
        echo "FAIL negative control ($3): not caught"; failures=$((failures + 1))
    fi
}
negative gka.cuh 's/adjn\[(size_t)i \* dk + j\] + adjn\[(size_t)j \* dk + i\] + /adjn[(size_t)i * dk + j] + /' \
    "Zend^T in gka's pass 3a" gka_backward
negative gka.cuh 's/^        if (A_LO) { wgmma_m64k16_rs<N, F16>(acc, a\[j\]\[1\], bhk, 1); }$//' \
    "the second bf16 piece of x and S in version 9's wgmma solve's register-operand products" gka_mma "100 16 24 pieces"
negative gka.cuh 's/^        if (A_LO) { wgmma_m64k16_rs<N, F16>(acc, a\[j\]\[1\], bhk, 1); }$//' \
    "the second fp16 piece of x and S in the fp16 wgmma solve's register-operand products" gka_mma "100 16 24 f16"
negative gka.cuh 's/^        if (A_LO) { wgmma_m64k16_rs<N, F16>(acc, a\[j\]\[1\], bhk, 1); }$//' \
    "the second bf16 piece of x and S in the solo solve's products" gka_mma "100 16 24 solo"
negative gka.cuh 's/w\[h\] = gka_pieces2<F16>(s\[e\] \* m0, s\[e + 1\] \* m1);/w[h] = gka_pieces2<F16>(s[e], s[e + 1]);/' \
    "the decay mask M on the solo solve's S (S (.) M)" gka_mma "100 16 24 solo"
negative gka.cuh 's/^                for (int i = 0; i < 4; i++) { dxs\[(4 \* t + i) \* GKA_SOLO_THREADS\] = dx\[t\]\[i\]; }$//' \
    "the solo solve's steps dx kept in shared memory (they stay the first step's)" gka_mma "100 16 24 solo"
negative gka.cuh 's/        scale = ldexpf(1.0f, min(GKA_F16_ROW_EXP + e - 1, 100));/        scale = 1.0f;/' \
    "the fp16 solve's row scales (wide inputs)" gka_mma "100 16 24 f16 wide"
negative gka.cuh 's/        scale = ldexpf(1.0f, min(GKA_F16_ROW_EXP + e - 1, 100));/        scale = 1.0f;/' \
    "the fp16 solo solve's row scales (wide inputs)" gka_mma "100 16 24 solo16 wide"
negative gka.cuh 's|            x\[t\]\[i\] += dx\[t\]\[i\];   // by the rounded step, the one the products take|            x[t][i] += step;|' \
    "the incremental form's x advanced by the rounded step (by the unrounded one instead)" gka_mma "100 16 24"
negative gka.cuh 's/max(0, min(GKA_MIXED_CHEAP_ITERS, iters - GKA_MIXED_CHEAP_ITERS))/iters/' \
    "the mixed solve's later iterations in every piece (X H0 in one piece throughout)" gka_mma "100 16 24 mixed"
negative gka.cuh 's/gka_pack2<true>(s\[e\] \* mask(c, j), s\[e + 1\] \* mask(c, j + 1))/gka_pack2<true>(s[e], s[e + 1])/' \
    "the decay mask M on the lean solve's S (S (.) M)" gka_mma "100 16 24 lean"
negative gka.cuh 's/^    gka_add_row_scaled_product<true>(p, sm.K, sm.Hs, sm.bsum, r0, hc0, lane);$//' \
    "diag(b) K H0 in the register-tile pass 3a" gka_mma "100 16 24"
negative gka.cuh 's/^    gka_add_row_scaled_product<false>(p, sm.V, sm.DU, sm.e, r0, hc0, lane);$//' \
    "diag(e) V DUend^T in the register-tile pass 3b" gka_mma "100 16 24"
negative gka.cuh 's/gka_warp_mma<NTL \/ 2, GKA_CHECKPOINT, true, true, C_LO, true>/gka_warp_mma<NTL \/ 2, GKA_CHECKPOINT, true, false, C_LO, true>/' \
    "the row operand's second bf16 piece in the register-tile chunk-state terms" gka_mma "100 16 24"
negative gdn_chunk.cuh 's/^        gdn_state_update(st, sm.Z, sm.P, dkp, warp, lane);.*$//' \
    "dE -= W^T dVn in the register-tile backward state pass" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/acc\[nt\]\[0\] \*= e0; acc\[nt\]\[1\] \*= e0; acc\[nt\]\[2\] \*= e1; acc\[nt\]\[3\] \*= e1;//' \
    "diag(gam) on Q h_n in the register-tile output kernel" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/sm.A\[i \* LDF + j\] = i > j ? sm.beta\[i\] \* s\[nt\]\[e\]/sm.A[i * LDF + j] = i > j ? s[nt][e]/' \
    "beta in A in the register-tile intra kernel" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/return i > j ? dT1\[nt\]\[e\] + sm.bg\[j\] \* dT2\[nt\]\[e\] : 0.0f;/return i > j ? dT1[nt][e] : 0.0f;/' \
    "phase 2's part of dT (dW kbg^T) in the register-tile backward chunk kernel" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/^                a\[e\] = gdn_scale_pair(a\[e\], gdn_decay_exp(gr.x - Gf\[c\]), gdn_decay_exp(gr.y - Gf\[c + 1\]));//' \
    "the decay of the row blocks' own rows in the register-tile per-channel intra kernel" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/        if (sm.ok\[(job >> 2) \/ PAIRS\]) { continue; }/        if (1) { continue; }/' \
    "the per-element diagonal blocks (strong decay) in the register-tile per-channel intra kernel" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/    for (int s = f; elementwise \&\& s < f + GDN_SUB - (DIAG ? 0 : 1); s++) {/    for (int s = f; s < f; s++) {/' \
    "the per-element diagonal blocks (strong decay) of the per-channel backward's rows(dAqk, Kw) and rows(Z1, Kw)" \
    gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/(racc, D, Y, ld, G, ldg, G + m0 \* ldg, m0, n0, 0, I + full, lane);/(racc, D, Y, ld, G, ldg, G + m0 * ldg, m0, n0, 0, I, lane);/' \
    "the tensor-core diagonal blocks (weak decay) of the per-channel backward's rows(dAqk, Kw) and rows(Z1, Kw)" \
    gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/{ f0\[nt\]\[e\] += r16\[nt\]\[e\]; f1\[nt\]\[e\] += c16\[nt\]\[e\]; }/{ f0[nt][e] += r16[nt][e]; }/' \
    "cols(dAqk, Q) in dkw of the register-tile per-channel backward chunk kernel" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/(first != nullptr ? first\[(bs \* dk + r) \* dv + j\] : 0.0f)/0.0f/' \
    "the combined start states in the split state passes (phase 3 from zero)" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/(phase1 \&\& j - dv == r ? 1.0f : 0.0f)/0.0f/' \
    "the identity on the split state passes' transition columns (phase 1)" gdn_mma "150 24 40"
negative gdn_chunk.cuh 's/= dkw_a\[u\] + sm.F1\[r \* LDF + cc\];/= dkw_a[u];/' "dkw += Z1^T K in the chunk backward" \
    pdn_chunk
negative pdn.cuh 's/carry = expf(lam\[cj\]) \* carry + c_in\[cj \* dk + d\];/carry = expf(lam[cj]) * carry;/' \
    "the later chunks' carries in the preconditioner backward" pdn_chunk
negative gdn_chunk.cuh 's/float s = sm.ce\[k0 + cc\];/float s = 0.0f;/' \
    "the chunk-end state terms of pkda's per-channel dg" pdn_chunk
negative gdn_chunk.cuh 's/for (int I = 1; I < GDN_NSUB; I++) {/for (int I = GDN_NSUB; I < GDN_NSUB; I++) {/' \
    "the off-diagonal 16-row blocks of the per-channel decayed products" pdn_chunk
negative kalman_scan.cuh 's/kalman_lane_step(lam, eta, a, a2, pb, ch.x, ch.y, kq\[i \* G + p\].x);//' \
    "the first half's steps before the backward's second half" kalman_filter "2 150 20 32"
negative kalman_scan.cuh 's/if (PASS == KALMAN_PASS_OUTPUT \&\& s > 0) { eta = /if (0) { eta = /' \
    "the earlier segments' information maps in the forward" kalman_filter "2 150 20 32"
negative kalman_scan.cuh 's/for (int j = S - 1; j > s; j--) {/for (int j = S - 1; j > S; j--) {/' \
    "the later segments' carry maps in the backward" kalman_filter "2 150 20 32"
[ $failures -eq 0 ]
