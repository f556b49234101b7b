"""
bench_cpu.py: the PyTorch side of the CPU benchmark of train_kla.

Times one full training step (forward, backward, global-norm clipping, AdamW) of the model of FORMATS.md in fp32
on the CPU, with PyTorch at its best: the model of scripts/train_kla.py with its mixer cores swapped for fast
ones, attention through F.scaled_dot_product_attention when torch has it (>= 2.0) and the masked-softmax
formulation otherwise, gdn/kaczmarz through the chunkwise-parallel algorithm of spec/gdn_kaczmarz.md
3.1-3.3 in plain torch (backward by autograd), torch.optim.AdamW (fused when this torch has a fused CPU AdamW).
At startup it checks, in float64 on a tiny input, that the chunkwise core equals train_kla.py's token-by-token
recurrence to 1e-10 (outputs and input gradients) and exits 1 if not.

Prints one line: `pytorch <mixer pattern> B=.. T=.. threads=..: <ms> ms/step` (mean over --steps timed steps).

Example:
    /usr/bin/python3 scripts/bench_cpu.py --mixer gdn:4 --depth 4 --width 256 --heads 4 --lin-heads 2 \
        --dk 64 --dv 64 --B 4 --T 256 --threads 2
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_kla  # noqa: E402  (the model, shared with the reference)

CHUNK = 64            # BT of the chunkwise algorithm (spec 0)
CHECK_TOLERANCE = 1e-10
# AdamW hyperparameters: train_kla.py's defaults (their values do not change the timing)
LR, BETAS, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0


def to_chunks(x, chunk):
    """[B, T, H, ...] -> [B, H, NT, chunk, ...], zero-padded at the end of time (spec 3.1: padded tokens with
    q = k = v = 0, beta = 0, g = 0 neither write nor decay)."""
    x = x.transpose(1, 2)
    pad = (-x.shape[2]) % chunk
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[:2] + (pad,) + x.shape[3:])], dim=2)
    return x.reshape(x.shape[:2] + (x.shape[2] // chunk, chunk) + x.shape[3:])


def delta_rule_chunkwise(q, k, v, beta, g, scale, chunk=CHUNK):
    """The gated delta rule, chunkwise (spec 3.1-3.3); same signature and result as
    train_kla.delta_rule_recurrent. q, k: [B, T, H, dk]; v: [B, T, H, dv]; beta, g: [B, T, H] -> o [B, T, H, dv]."""
    B, T, H, dk = k.shape
    q, k, v, beta, g = (to_chunks(t, chunk) for t in (q, k, v, beta, g))     # [B, H, NT, BT, ...]
    # per-chunk decays (3.1): G_i = chunk-local cumsum of g, gam_i = exp(G_i), Gam_ij = exp(G_i - G_j) for
    # i >= j; the mask is applied before exp so the upper triangle never overflows
    G = g.cumsum(-1)
    gam = G.exp()
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril()
    Gam = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    decay_to_end = (G[..., -1:] - G).exp()                                   # exp(G_BT - G_i)
    # UT transform (3.1, 3.2): W = Tm diag(beta gam) K, U = Tm diag(beta) V with Tm = (I + A)^-1,
    # A = strictly_lower(diag(beta) K K^T (.) Gam), as one triangular solve without forming Tm
    # (unitriangular=True: the unit diagonal is implied and A's zero diagonal is not read)
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * Gam).tril(-1)
    rhs = torch.cat([(beta * gam)[..., None] * k, beta[..., None] * v], dim=-1)
    W, U = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True).split([dk, v.shape[-1]], dim=-1)
    QK = (q @ k.transpose(-1, -2)) * Gam                                     # (Q K^T) (.) M
    # inter-chunk recurrence (3.3): sequential over chunks, S = state at the chunk start (unbind, not
    # indexing, so that autograd stacks the chunk gradients once instead of once per chunk)
    S = k.new_zeros(B, H, dk, v.shape[-1])
    outputs = []
    for qn, kn, Wn, Un, QKn, gamn, decn in zip(*(t.unbind(2) for t in (q, k, W, U, QK, gam, decay_to_end))):
        Vn = Un - Wn @ S                                                     # true write vectors u_i
        outputs.append(scale * (gamn[..., None] * (qn @ S) + QKn @ Vn))
        S = gamn[..., -1, None, None] * S + kn.transpose(-1, -2) @ (decn[..., None] * Vn)
    o = torch.stack(outputs, dim=2).reshape(B, H, -1, v.shape[-1])[:, :, :T]
    return o.transpose(1, 2)


def attention_fast(q, k, v):
    """Causal softmax attention through SDPA (torch >= 2.0), else train_kla's masked-softmax formulation."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return train_kla.causal_softmax_attention(q, k, v)


def check_chunkwise_core():
    """max relative difference, chunkwise vs recurrent core, of the outputs and of the input gradients of a
    random linear functional, in float64: GDN-like (unit keys) and Kaczmarz-like (raw keys) inputs, T = 100
    (two chunks, the second padded)."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, dk, dv = 2, 100, 2, 8, 12
    worst = 0.0
    for unit_keys in (True, False):
        rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)   # noqa: E731
        q = train_kla.l2n(rnd(B, T, H, dk))
        k = F.silu(rnd(B, T, H, dk))
        eta = torch.sigmoid(rnd(B, T, H))
        beta = eta if unit_keys else eta / (k.pow(2).sum(-1) + train_kla.KACZMARZ_EPS)
        k = train_kla.l2n(k) if unit_keys else k
        g = -torch.rand(B, T, H, generator=gen, dtype=torch.float64)
        v, probe = rnd(B, T, H, dv), rnd(B, T, H, dv)
        results = []
        for core in (train_kla.delta_rule_recurrent, delta_rule_chunkwise):
            inputs = [t.clone().requires_grad_() for t in (q, k, v, beta, g)]
            o = core(*inputs, dk ** -0.5)
            results.append([o] + list(torch.autograd.grad((o * probe).sum(), inputs)))
        for ref, got in zip(*results):
            worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
    return worst


def make_adamw(params):
    """torch.optim.AdamW with FORMATS.md's weight-decay groups; fused if this torch supports it on the CPU."""
    groups = [{"params": [p for n, p in params.items() if train_kla.is_decayed(n)], "weight_decay": WEIGHT_DECAY},
              {"params": [p for n, p in params.items() if not train_kla.is_decayed(n)], "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=ADAM_EPS, fused=True)
    except (TypeError, RuntimeError):     # torch < 2.0 has no `fused`; 2.0-2.3 fuse on CUDA only
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=ADAM_EPS)


def warn_if_reference_blas():
    """Debian's torch calls whatever libblas.so.3 the system alternative selects; without OpenBLAS that is netlib's
    unoptimised reference BLAS (/usr/lib/<arch>/blas/), about 10x slower here, and the benchmark would measure it
    rather than PyTorch. Say so on stderr (Linux only: reads the mapped libraries from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "libblas.so" in line}
    except OSError:
        return
    if any("/blas/libblas.so" in lib for lib in libs):
        print("warning: torch uses the reference BLAS " + " ".join(sorted(libs)) +
              "; install libopenblas0-pthread for a fair benchmark", file=sys.stderr)


def train_step(params, optimizer, cfg, x, y, cores):
    """forward + backward + clipping + AdamW, as one step of train_kla.c."""
    optimizer.zero_grad(set_to_none=True)
    loss = train_kla.cross_entropy_loss(train_kla.forward(params, cfg, x, cores), y, cfg.vocab_size)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), GRAD_CLIP)
    optimizer.step()


def main():
    parser = argparse.ArgumentParser(description="PyTorch CPU benchmark of the train_kla model (fp32)")
    train_kla.add_model_args(parser, max_seq_len=1024)   # train_kla.c's default
    parser.add_argument("--B", type=int, default=4, help="batch size")
    parser.add_argument("--T", type=int, default=64, help="sequence length")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    args = parser.parse_args()
    if min(args.B, args.T, args.threads, args.steps) < 1 or args.warmup < 0:
        parser.error("--B, --T, --threads and --steps must be positive, --warmup non-negative")
    cfg = train_kla.config_from_args(args, parser)
    torch.set_num_threads(args.threads)
    warn_if_reference_blas()

    err = check_chunkwise_core()
    if err > CHECK_TOLERANCE:
        print(f"error: chunkwise core differs from the recurrent core by {err:.2e} (> {CHECK_TOLERANCE:g})",
              file=sys.stderr)
        sys.exit(1)

    gen = torch.Generator().manual_seed(args.seed)
    params = {n: w.requires_grad_() for n, w in train_kla.init_params(cfg, gen).items()}
    tokens = torch.randint(0, cfg.vocab_size, (args.B, args.T + 1), generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]
    optimizer = make_adamw(params)
    cores = train_kla.Cores(attention=attention_fast, delta_rule=delta_rule_chunkwise)
    for _ in range(args.warmup):
        train_step(params, optimizer, cfg, x, y, cores)
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step(params, optimizer, cfg, x, y, cores)
    ms = (time.perf_counter() - start) * 1000 / args.steps
    print(f"pytorch {train_kla.canonical_pattern(cfg.mixers)} B={args.B} T={args.T} threads={args.threads}: "
          f"{ms:.1f} ms/step")


if __name__ == "__main__":
    main()
