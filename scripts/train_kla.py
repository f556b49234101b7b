"""
train_kla.py: the PyTorch reference of train_kla (the ground truth that train_kla.c is tested against).

It builds the model of FORMATS.md ("The model"): a GPT-2 trunk whose per-layer mixer is softmax attention
(`attn`), Gated DeltaNet (`gdn`), Kaczmarz Linear Attention (`kaczmarz`), one of the Preconditioned DeltaNet
family (`pdn`, `pgdn`, `pkda`), Gated KalmaNet (`gka`, with GQA key/value heads: --gka-kv-heads) or Kalman Linear Attention (`kalman`, presets plain and
mamba: --kalman-preset, --kalman-expand, --kalman-n), chosen by a pattern such as `gdn:1,attn:1,gka:1,kalman:1`.
The recurrent mixers run the plain token-by-token recurrences of spec/gdn_kaczmarz.md 2.1,
spec/pdn.md 2.1, spec/gka.md 3 and spec/kalman.md 2.3 (with
the torch-path floors of its section 2.5; independent of any chunkwise algorithm or scan), attention the plain
masked softmax. kalman's gradient is autograd of that sequential filter (the ground truth for the C adjoint). gka runs the same r-step Chebyshev iteration as the C code (spec 3.1), and its
gradient is the implicit one of spec 3.2 (one adjoint Chebyshev solve per token), not autograd through the iterations. The trunk's norm (LayerNorm with bias or RMSNorm, --norm, --norm-eps) and MLP (GELU, SwiGLU or none,
--mlp, --mlp-hidden) are FORMATS.md header slots 16 and 20-22. Then it
  1. draws the initial fp32 weights from --seed (FORMATS.md "Initialisation") and writes PREFIX_model.bin,
  2. draws one batch of random tokens, runs forward/backward in --dtype (float64 by default, for tight
     comparisons of fp32 C code) and writes PREFIX_debug.bin: x, y, logits, loss, every parameter gradient,
  3. trains --steps steps on that same batch (global-norm clipping, then AdamW written out by hand, with the
     learning-rate groups of FORMATS.md: kalman's state-space parameters at 0.1x lr) and appends the loss of
     every step to the debug file.

Runs on torch 1.13 CPU (Debian's python3-torch) and torch 2.x with CUDA. scripts/bench_cpu.py imports the model
from here and swaps the mixer cores through `Cores`.

Example:
    /usr/bin/python3 scripts/train_kla.py --mixer gdn:2 --depth 2 --width 64 --heads 4 --lin-heads 2 \
        --dk 16 --dv 24 --B 2 --T 80 --seed 2 --out dev/test/ref/gdn
"""
import argparse
import array
import collections
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------------------
# constants of FORMATS.md

CHECKPOINT_MAGIC, CHECKPOINT_VERSION = 20251121, 2
DEBUG_MAGIC, DEBUG_VERSION = 20251122, 1
HEADER_SLOTS = 256                      # 1024-byte header of int32 slots (llm.c convention)
PATTERN_OFFSET = 512                    # bytes 512..1023 of the checkpoint header hold the pattern string
TABLE_ENTRY_BYTES = 128                 # name[92] | uint32 crc32c | dtype | ndim | shape[4] | int64 offset
TABLE_NAME_BYTES = 92
CHECKSUM_SLOT = 34                      # CRC32C of the header (this slot zero) and the tensor table

NORM_EPS = 1e-5                         # default eps of the block and final norms (LayerNorm or RMSNorm)
L2N_EPS = 1e-6                          # inside the sqrt of the q/k L2 normalisation (spec 1.2 step 4)
ONORM_EPS = 1e-5                        # gated output RMSNorm of gdn/kaczmarz (FORMATS.md; spec 1.2 step 8)
KACZMARZ_EPS = 1e-6                     # beta = eta / (||k||^2 + KACZMARZ_EPS) (spec 1.2 step 5)
CONV_SIZE = 4                           # W, taps of the short causal depthwise conv
PRECOND_X = 1.5                         # pdn/pgdn/pkda squash range: m in (1/x, x) (spec/pdn.md 1.3)
PRECOND_EPS = 1e-6                      # pdn/pgdn/pkda eps inside log(A + eps) (spec/pdn.md 1.3)
PRECOND_ONORM_EPS = 1e-6                # pdn/pgdn/pkda output RMSNorm eps (spec/pdn.md 1.5)
PRECOND_LOG_SCALE_INIT = -0.2           # c = log_scale, the squash centre (spec/pdn.md 10.7)
GKA_ITERS = 30                          # r, Chebyshev iterations of gka (spec/gka.md 2.1, 3.1)
GKA_RIDGE = 0.02                        # a in lambda_t = a ||H_t||_F (spec/gka.md 2.1)
GKA_ONORM_EPS = 1e-6                    # gka output RMSNorm eps (spec/gka.md 2.1 norm_eps)
GKA_NORM_EPS = 1e-6                     # q/k L2 norm eps of gka, added to the norm (spec/gka.md 2.3 step 4)
GKA_BETA_EPS = 1e-6                     # k, v scaled by (beta + 1e-6) (spec/gka.md 2.3 step 5)
KALMAN_PRESETS = ("plain", "mamba")     # header slot 31: index in this tuple (spec/kalman.md 1.3)
KALMAN_OBS_VAR_MIN = 1e-4               # Lv = 1 / (softplus(ls) + 1e-4) (spec/kalman.md 1.3 step 5)
KALMAN_DELTA_MIN = 1e-7                 # Delta = softplus(delta_raw) + 1e-7 (spec/kalman.md 1.3 step 6)
KALMAN_P_MIN = 1e-7                     # p = max(p_raw, 1e-7)
KALMAN_FLOOR = 1e-12                    # torch-path floors of abar^2, den, lam, pbar and of ||kr||, ||qr|| (spec 2.5)
KALMAN_P_INIT = 0.01                    # p_raw init (spec/kalman.md 1.2)
KALMAN_SKIP_INIT = -1.0                 # lambda_skip init
KALMAN_CONV_INIT = 0.5                  # conv.w ~ U(-1/sqrt(K), 1/sqrt(K)), K = 4
KALMAN_SSM_LR_SCALE = 0.1               # learning-rate group of the state-space parameters (FORMATS.md)

MIXERS = ("attn", "gdn", "kaczmarz", "pdn", "pgdn", "pkda", "gka", "kalman")
NORMS = ("layernorm", "rmsnorm")        # header slot 20: index in this tuple
MLPS = ("gelu", "swiglu", "none")       # header slot 21: index in this tuple
RECURRENT_MIXERS = ("gdn", "kaczmarz")
PRECOND_MIXERS = ("pdn", "pgdn", "pkda")

# matrices that get decoupled weight decay (FORMATS.md "Weight decay"), matched as name suffixes
# (kalman.conv.w excepted: spec/kalman.md 1.2 note c puts it in the 1-D group)
DECAYED_SUFFIXES = ("attn.qkv.w", "attn.proj.w", "in_proj.w", "conv.w", "out_proj.w", "f2.w", "g2.w",
                    "sensor.w", "var.w", "mlp.fc.w", "mlp.proj.w")
UNDECAYED_SUFFIXES = ("kalman.conv.w",)
# kalman's state-space parameters: 0.1x learning rate, no weight decay (FORMATS.md "Learning-rate groups")
KALMAN_SSM_SUFFIXES = ("kalman.delta_raw", "kalman.lambda_log", "kalman.p_raw", "kalman.lambda_skip")
# residual output projections, initialised with std 0.02/sqrt(2L) (GPT-2)
RESIDUAL_PROJ_SUFFIXES = ("attn.proj.w", "out_proj.w", "mlp.proj.w")

# ----------------------------------------------------------------------------------------------------------------
# model configuration


Config = collections.namedtuple(
    "Config", "vocab_size padded_vocab_size max_seq_len mixers n_embd n_head lin_heads lin_dk lin_dv "
              "norm mlp mlp_hidden norm_eps kalman_expand kalman_n kalman_preset kalman_rank gka_kv_heads")


def default_mlp_hidden(mlp, C):
    """GELU: 4C; SwiGLU: 256 * ceil(floor(8C/3) / 256) (FLA's rule); none: 0."""
    if mlp == "gelu":
        return 4 * C
    if mlp == "swiglu":
        return 256 * -(-(8 * C // 3) // 256)
    return 0


def parse_pattern(pattern):
    """'gdn:1,attn:2' -> ['gdn', 'attn', 'attn']; a name without a count means one layer (as train_kla.c)."""
    mixers = []
    for item in pattern.split(","):
        name, sep, count = item.partition(":")
        if name not in MIXERS or (sep and not (count.isdigit() and int(count) >= 1)):
            raise ValueError(f"bad item '{item}' in mixer pattern '{pattern}' (want name[:count], names {MIXERS})")
        mixers += [name] * (int(count) if sep else 1)
    return mixers


def canonical_pattern(mixers):
    """Run-length form with consecutive equal mixers merged: ['attn', 'attn', 'gdn'] -> 'attn:2,gdn:1'."""
    runs = []
    for name in mixers:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ",".join(f"{name}:{count}" for name, count in runs)


def has_wpe(cfg):
    """The position embedding exists only when every layer is attn (GPT-2 exactly)."""
    return all(m == "attn" for m in cfg.mixers)


def tensor_shapes(cfg):
    """[(name, shape)] in checkpoint order (FORMATS.md "Tensor order and names")."""
    C, H, dk, dv = cfg.n_embd, cfg.lin_heads, cfg.lin_dk, cfg.lin_dv
    shapes = [("wte", (cfg.padded_vocab_size, C))]
    if has_wpe(cfg):
        shapes.append(("wpe", (cfg.max_seq_len, C)))
    for l, mixer in enumerate(cfg.mixers):
        p = f"h{l}."
        shapes += norm_shapes(cfg, p + "ln1")
        if mixer == "attn":
            shapes += [(p + "attn.qkv.w", (3 * C, C)), (p + "attn.qkv.b", (3 * C,)),
                       (p + "attn.proj.w", (C, C)), (p + "attn.proj.b", (C,))]
        elif mixer in PRECOND_MIXERS:
            shapes += precond_shapes(cfg, p + mixer + ".", mixer)
        elif mixer == "kalman":
            shapes += kalman_shapes(cfg, p + "kalman.")
        elif mixer == "gka":
            m = p + "gka."
            shapes += [(m + "in_proj.w", (sum(gka_split(cfg)), C)), (m + "conv.w", (gka_split(cfg)[0], CONV_SIZE)),
                       (m + "b_bias", (H,)), (m + "alpha_bias", (H,)), (m + "A_log", (H,)), (m + "dt_bias", (H,)),
                       (m + "onorm.w", (dv,)), (m + "out_proj.w", (C, H * dv))]
        else:
            m = p + mixer + "."
            proj_rows = 2 * H * dk + 2 * H * dv + 2 * H     # [q | k | v | z | a | b]
            conv_channels = 2 * H * dk + H * dv             # q, k, v
            shapes += [(m + "in_proj.w", (proj_rows, C)), (m + "conv.w", (conv_channels, CONV_SIZE)),
                       (m + "b_bias", (H,)), (m + "A_log", (H,)), (m + "dt_bias", (H,)),
                       (m + "onorm.w", (dv,)), (m + "out_proj.w", (C, H * dv))]
        Hm = cfg.mlp_hidden
        if cfg.mlp == "gelu":
            shapes += norm_shapes(cfg, p + "ln2") + [
                (p + "mlp.fc.w", (Hm, C)), (p + "mlp.fc.b", (Hm,)),
                (p + "mlp.proj.w", (C, Hm)), (p + "mlp.proj.b", (C,))]
        elif cfg.mlp == "swiglu":                         # fc rows [gate | up], no biases
            shapes += norm_shapes(cfg, p + "ln2") + [(p + "mlp.fc.w", (2 * Hm, C)), (p + "mlp.proj.w", (C, Hm))]
        # mlp none: no ln2, no MLP tensors
    shapes += norm_shapes(cfg, "lnf")
    return shapes


def precond_split(cfg, mixer):
    """Row blocks of a pdn/pgdn/pkda in_proj.w: [q, k, v, b, aP, bP] (conv'd q|k|v first), then pgdn [a],
    pkda [f1 (dv), g1 (dv)] (FORMATS.md)."""
    H, dk, dv = cfg.lin_heads, cfg.lin_dk, cfg.lin_dv
    rows = [2 * H * dk + H * dv, H, H, H]
    if mixer == "pgdn":
        rows += [H]
    elif mixer == "pkda":
        rows += [dv, dv]
    return rows


def gka_split(cfg):
    """Row blocks of a gka in_proj.w: [q (H*dk) | k (Hkv*dk) | v (Hkv*dv) (conv'd), gate (H*dv), a (H), b (H),
    alpha (H)] (FORMATS.md); Hkv = gka_kv_heads (= H without GQA)."""
    H, Hkv, dk, dv = cfg.lin_heads, cfg.gka_kv_heads, cfg.lin_dk, cfg.lin_dv
    return [H * dk + Hkv * dk + Hkv * dv, H * dv, H, H, H]


def kalman_split(cfg):
    """Row blocks of a kalman sensor.w (spec/kalman.md 1.3 step 3): plain [v (Dk) | ls (Dk) | kr (N) | qr (N)],
    mamba [ls_r (R) | kr (N) | qr (N)]."""
    Dk, N = cfg.kalman_expand * cfg.n_embd, cfg.kalman_n
    if cfg.kalman_preset == "plain":
        return [Dk, Dk, N, N]
    return [cfg.kalman_rank, N, N]


def kalman_shapes(cfg, m):
    """Tensors of one kalman layer in checkpoint order; m = 'h<l>.kalman.' (FORMATS.md, spec/kalman.md 1.2)."""
    C, Dk, N = cfg.n_embd, cfg.kalman_expand * cfg.n_embd, cfg.kalman_n
    shapes = [(m + "in_proj.w", (2 * Dk, C)), (m + "conv.w", (Dk, CONV_SIZE)), (m + "conv.b", (Dk,)),
              (m + "sensor.w", (sum(kalman_split(cfg)), Dk))]
    if cfg.kalman_preset == "mamba":
        shapes.append((m + "var.w", (Dk, cfg.kalman_rank)))
    return shapes + [(m + "out_proj.w", (C, Dk)), (m + "delta_raw", (Dk, N)), (m + "lambda_log", (Dk, N)),
                     (m + "p_raw", (Dk, N)), (m + "lambda_skip", (1,))]


def precond_shapes(cfg, m, mixer):
    """Tensors of one pdn/pgdn/pkda layer in checkpoint order; m = 'h<l>.<mixer>.'."""
    C, H, dk, dv = cfg.n_embd, cfg.lin_heads, cfg.lin_dk, cfg.lin_dv
    shapes = [(m + "in_proj.w", (sum(precond_split(cfg, mixer)), C)),
              (m + "conv.w", (2 * H * dk + H * dv, CONV_SIZE))]
    if mixer == "pgdn":
        shapes += [(m + "A_log", (H,)), (m + "dt_bias", (H,))]
    elif mixer == "pkda":
        shapes += [(m + "A_log", (H,)), (m + "dt_bias", (H * dk,)),
                   (m + "f2.w", (H * dk, dv)), (m + "g2.w", (H * dv, dv)), (m + "g2.b", (H * dv,))]
    return shapes + [(m + "A_log_P", (H,)), (m + "dt_bias_P", (H,)), (m + "log_scale", (H,)),
                     (m + "onorm.w", (dv,)), (m + "out_proj.w", (C, H * dv))]


def norm_shapes(cfg, p):
    """LayerNorm: weight and bias; RMSNorm: weight only."""
    C = cfg.n_embd
    return [(p + ".w", (C,))] + ([(p + ".b", (C,))] if cfg.norm == "layernorm" else [])


def is_decayed(name):
    return name.endswith(DECAYED_SUFFIXES) and not name.endswith(UNDECAYED_SUFFIXES)


def lr_scale(name):
    """Learning-rate group of a tensor (FORMATS.md "Learning-rate groups"): 0.1 for kalman's state-space
    parameters, 1 for everything else."""
    return KALMAN_SSM_LR_SCALE if name.endswith(KALMAN_SSM_SUFFIXES) else 1.0


# ----------------------------------------------------------------------------------------------------------------
# initialisation (FORMATS.md "Initialisation"; mixer parameters: spec 1.5, FLA scheme)


def init_tensor(name, shape, cfg, gen):
    """One fp32 tensor, drawn from gen (tensors are drawn in checkpoint order, so the order fixes the stream)."""
    t = torch.zeros(shape, dtype=torch.float32)
    if ".kalman." in name and name.endswith(("conv.w", "delta_raw", "lambda_log", "p_raw", "lambda_skip")):
        return init_kalman_ssm(name, t, gen)
    if name.endswith(RESIDUAL_PROJ_SUFFIXES):
        t.normal_(0.0, 0.02 / math.sqrt(2 * len(cfg.mixers)), generator=gen)
    elif len(shape) == 2:                                   # wte, wpe, qkv, fc, in_proj, conv taps
        t.normal_(0.0, 0.02, generator=gen)
    elif name.endswith(("ln1.w", "ln2.w", "lnf.w", "onorm.w")):
        t.fill_(1.0)
    elif name.endswith(("A_log", "A_log_P")):               # A_log = log(A), A ~ U(0, 16); pdn family U(1, 16)
        precond = name.split(".")[1] in PRECOND_MIXERS
        t = t.uniform_(1.0 if precond else 0.0, 16.0, generator=gen).log()
    elif name.endswith("log_scale"):                        # squash centre c of pdn/pgdn/pkda
        t.fill_(PRECOND_LOG_SCALE_INIT)
    elif name.endswith(("dt_bias", "dt_bias_P")):           # dt log-uniform in [1e-3, 1e-1], softplus^-1(dt)
        u = t.uniform_(0.0, 1.0, generator=gen)
        dt = torch.exp(u * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        t = dt + torch.log(-torch.expm1(-dt))
    # everything else (biases, b_bias, alpha_bias, g2.b, LayerNorm biases) stays 0
    if name == "wte":
        t[cfg.vocab_size:] = 0.0                            # padding rows of the tied embedding
    return t


def init_kalman_ssm(name, t, gen):
    """kalman's conv taps and state-space parameters (FORMATS.md "Initialisation", spec/kalman.md 1.2):
    conv.w U(-0.5, 0.5); delta_raw = softplus^-1(Delta0), Delta0 log-uniform in [1e-3, 1e-1] clamped >= 1e-4
    (drawn as dt_bias); lambda_log 0 (kappa = 1); p_raw 0.01; lambda_skip -1."""
    if name.endswith("conv.w"):
        return t.uniform_(-KALMAN_CONV_INIT, KALMAN_CONV_INIT, generator=gen)
    if name.endswith("delta_raw"):
        u = t.uniform_(0.0, 1.0, generator=gen)
        delta0 = torch.exp(u * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        return delta0 + torch.log(-torch.expm1(-delta0))
    if name.endswith("p_raw"):
        return t.fill_(KALMAN_P_INIT)
    if name.endswith("lambda_skip"):
        return t.fill_(KALMAN_SKIP_INIT)
    return t                                                # lambda_log 0


def init_params(cfg, gen):
    """{name: fp32 tensor} in checkpoint order."""
    return {name: init_tensor(name, shape, cfg, gen) for name, shape in tensor_shapes(cfg)}


# ----------------------------------------------------------------------------------------------------------------
# mixer cores (swappable: bench_cpu.py replaces them with faster equivalents)


def causal_softmax_attention(q, k, v):
    """q, k, v: [B, nh, T, hs] -> [B, nh, T, hs]; plain masked softmax with scale 1/sqrt(hs)."""
    T, hs = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
    return att @ v


def delta_rule_recurrent(q, k, v, beta, g, scale):
    """Gated delta rule, token by token (spec 2.1), K-first state S [B, H, dk, dv], S_0 = 0, read after write.

    q, k: [B, T, H, dk]; v: [B, T, H, dv]; beta, g: [B, T, H]. Returns o: [B, T, H, dv].
    """
    B, T, H, dk = k.shape
    S = k.new_zeros(B, H, dk, v.shape[-1])
    outputs = []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None, None] * S                          # Sbar_t = alpha_t S_{t-1}
        r = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])              # r_t = v_t - Sbar_t^T k_t
        u = beta[:, t, :, None] * r                                          # u_t = beta_t r_t
        S = S + k[:, t, :, :, None] * u[:, :, None, :]                       # S_t = Sbar_t + k_t u_t^T
        outputs.append(torch.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))    # o_t = S_t^T (scale q_t)
    return torch.stack(outputs, dim=1)


def precond_delta_rule_recurrent(q, k, v, beta, g, gP, bP, c, x, eps, return_state=False):
    """Preconditioned (gated / KDA) delta rule, token by token (spec/pdn.md 2.1), per head, S_0 = 0, A_0 = 0:
    A_t = exp(gP) A_{t-1} + bP k^2; r = log(A_t + eps) - c; m = exp(-ln(x) r / (1 + |r|)); k~ = m k;
    S' = exp(g) S_{t-1} (row d by exp(g[d])); u = beta (v - S'^T k); S_t = S' + k~ u^T; o_t = S_t^T q_t.

    q (already scaled by dk^-1/2), k (unit): [B, T, H, dk]; v: [B, T, H, dv]; beta, gP, bP: [B, T, H];
    g: None (pdn, no decay), [B, T, H, 1] (pgdn, scalar per head) or [B, T, H, dk] (pkda); c: [H]; x, eps: floats.
    Returns o [B, T, H, dv], and with return_state also (S_T [B, H, dk, dv], A_T [B, H, dk]).
    """
    B, T, H, dk = k.shape
    S = k.new_zeros(B, H, dk, v.shape[-1])
    A = k.new_zeros(B, H, dk)
    ln_x = math.log(x)
    outputs = []
    for t in range(T):
        kt = k[:, t]
        A = torch.exp(gP[:, t])[..., None] * A + bP[:, t, :, None] * kt * kt    # A_t
        r = torch.log(A + eps) - c[:, None]
        m = torch.exp(-ln_x * (r / (1 + r.abs())))                              # "fast" symmetric squash
        if g is not None:
            S = torch.exp(g[:, t])[..., None] * S                                # S'_t
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt))   # read with k
        S = S + (m * kt)[..., None] * u[:, :, None, :]                          # write along k~ = m k
        outputs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))               # o_t = S_t^T q_t
    o = torch.stack(outputs, dim=1)
    return (o, S, A) if return_state else o


def chebyshev_omegas(a, r):
    """omega_1..omega_r of CHEB (spec/gka.md 3.1): omega_0 = 2, omega_i = 1 / (1 - rho^2/4 omega_{i-1}), rho = 1/(1+2a);
    the same for every token and head (computed in double precision on the host)."""
    rho4 = (1.0 / (1.0 + 2.0 * a)) ** 2 / 4.0
    omegas, omega = [], 2.0
    for _ in range(r):
        omega = 1.0 / (1.0 - rho4 * omega)
        omegas.append(omega)
    return omegas


def chebyshev_solve(H, f, b, a, r):
    """CHEB(H, f, b) of spec/gka.md 3.1, batched: r Chebyshev steps towards (H + a f I)^-1 b.

    H: [..., d, d] symmetric PSD; f: [...] (= ||H||_F); b: [..., d]. mu = a f, L = f + a f: tau = 2 / (f (1 + 2a)).
    """
    tau = (2.0 / (f * (1.0 + 2.0 * a)))[..., None]
    af = (a * f)[..., None]
    x_prev = torch.zeros_like(b)
    x = tau * b                                           # one plain gradient step from 0
    for omega in chebyshev_omegas(a, r):
        y = tau * omega * (torch.einsum("...ij,...j->...i", H, x) + af * x - b) + (omega - 1.0) * x_prev
        x_prev = x
        x = omega * x - y
    return x


class ChebyshevSolve(torch.autograd.Function):
    """x = CHEB(H, ||H||_F, q) with the implicit gradient of spec/gka.md 3.2 (bp_lambda on):
    z = CHEB(H, f, dx) (the adjoint solve, same matrix and constants), dq = z, w = 2 a (x.z) / f,
    dH = -z x^T - (w / 2) H. Gradients through tau and rho (which depend on f) are ignored, as in the official code;
    lambda = a ||H||_F contributes only through the w term."""

    @staticmethod
    def forward(ctx, H, q, a, r):
        f = torch.linalg.norm(H, dim=(-2, -1))            # Frobenius norm, [...]
        x = chebyshev_solve(H, f, q, a, r)
        ctx.save_for_backward(H, f, x)
        ctx.a, ctx.r = a, r
        return x

    @staticmethod
    def backward(ctx, dx):
        H, f, x = ctx.saved_tensors
        z = chebyshev_solve(H, f, dx, ctx.a, ctx.r)
        w = 2.0 * ctx.a * (x * z).sum(-1) / f
        dH = -z[..., :, None] * x[..., None, :] - (w / 2.0)[..., None, None] * H
        return dH, z, None, None


def gka_recurrent(q, k, v, g, alpha, scale, a, r):
    """Gated KalmaNet core, token by token (spec/gka.md 3), per head, H_0 = U_0 = 0:
    H_t = exp(g) H_{t-1} + k k^T; U_t = exp(g) U_{t-1} + k v^T; x = CHEB(H_t, ||H_t||_F, q_t);
    o_t = scale U_t^T (q_t + alpha_t (x - q_t)).

    q (unit, q_hat), k (beta-scaled unit key): [B, T, H, dk]; v (beta-scaled): [B, T, H, dv]; g, alpha: [B, T, H].
    Returns o [B, T, H, dv]. The solve's gradient is the implicit one (ChebyshevSolve).
    """
    B, T, nh, dk = k.shape
    Hs = k.new_zeros(B, nh, dk, dk)
    U = k.new_zeros(B, nh, dk, v.shape[-1])
    outputs = []
    for t in range(T):
        gamma = torch.exp(g[:, t])[..., None, None]
        kt, qt = k[:, t], q[:, t]
        Hs = gamma * Hs + kt[..., :, None] * kt[..., None, :]                   # H_t
        U = gamma * U + kt[..., :, None] * v[:, t, :, None, :]                  # U_t
        x = ChebyshevSolve.apply(Hs, qt, a, r)                                  # ~ (H_t + a f_t I)^-1 q_t
        qmix = qt + alpha[:, t, :, None] * (x - qt)                             # alpha connection
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", U, qmix))          # o_t = s U_t^T qmix
    return torch.stack(outputs, dim=1)


def kalman_filter_sequential(v, Lv, k, q, abar, pbar, return_state=False):
    """Kalman Linear Attention filter, token by token (spec/kalman.md 2.3), vectorised over the lanes (b, d, n),
    information form with lam_0 = 1, eta_0 = 0 and the torch-path floors of spec 2.5 (torch.clamp: zero
    subgradient where a floor binds):
        den = max(max(abar^2, 1e-12) + pbar lam_{t-1}, 1e-12); rho = 1 / den
        eta_t = abar rho eta_{t-1} + v Lv k;  lam_t = lam_{t-1} rho + Lv k^2   (both with rho from lam_{t-1})
        y_t[d] = sum_n q[n] eta_t[d, n] / max(lam_t[d, n], 1e-12)

    v, Lv: [B, T, D]; k, q: [B, T, N] (unit); abar, pbar: [D, N]. Returns y_s [B, T, D], and with return_state
    also (lam_T, eta_T) [B, D, N]. No variance output.
    """
    B, T, D = v.shape
    abar2 = torch.clamp(abar * abar, min=KALMAN_FLOOR)
    lam = v.new_ones(B, D, abar.shape[-1])
    eta = v.new_zeros(B, D, abar.shape[-1])
    outputs = []
    for t in range(T):
        kt, Lvt = k[:, t, None, :], Lv[:, t, :, None]                        # [B, 1, N], [B, D, 1]
        rho = 1.0 / torch.clamp(abar2 + pbar * lam, min=KALMAN_FLOOR)        # predict: lam^- = lam rho
        eta = abar * rho * eta + (v[:, t, :, None] * Lvt) * kt               # eta_t = alpha_t eta_{t-1} + r_t
        lam = lam * rho + Lvt * (kt * kt)                                    # lam_t = lam^- + phi_t
        mean = eta / torch.clamp(lam, min=KALMAN_FLOOR)
        outputs.append((mean * q[:, t, None, :]).sum(-1))                    # y_t = sum_n q mean
    y = torch.stack(outputs, dim=1)
    return (y, lam, eta) if return_state else y


Cores = collections.namedtuple("Cores", "attention delta_rule precond_delta_rule gka kalman",
                               defaults=(precond_delta_rule_recurrent, gka_recurrent, kalman_filter_sequential))
REFERENCE_CORES = Cores(attention=causal_softmax_attention, delta_rule=delta_rule_recurrent,
                        precond_delta_rule=precond_delta_rule_recurrent, gka=gka_recurrent,
                        kalman=kalman_filter_sequential)

# ----------------------------------------------------------------------------------------------------------------
# layers (params is the {name: tensor} dict; p the layer's name prefix)


def norm(x, params, p, cfg):
    """Block/final norm: LayerNorm (x - mean) / sqrt(biased var + eps) * w + b, or RMSNorm
    x / sqrt(mean(x^2) + eps) * w (no bias), eps = cfg.norm_eps."""
    if cfg.norm == "layernorm":
        return F.layer_norm(x, x.shape[-1:], params[p + "w"], params[p + "b"], cfg.norm_eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * params[p + "w"]


def attention_mixer(x, params, p, cfg, cores):
    """GPT-2 causal self-attention: qkv rows [q | k | v], heads of size C/n_head."""
    B, T, C = x.shape
    nh = cfg.n_head
    qkv = F.linear(x, params[p + "attn.qkv.w"], params[p + "attn.qkv.b"])
    q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in qkv.split(C, dim=-1))
    y = cores.attention(q, k, v).transpose(1, 2).reshape(B, T, C)
    return F.linear(y, params[p + "attn.proj.w"], params[p + "attn.proj.b"])


def causal_depthwise_conv(u, w):
    """u: [B, T, D], w: [D, W]. y_t[c] = sum_j w[c, j] u_{t-(W-1)+j}[c] with zeros before t = 0 (spec 1.2 step 2)."""
    T, W = u.shape[1], w.shape[1]
    y = F.conv1d(u.transpose(1, 2), w.unsqueeze(1), padding=W - 1, groups=w.shape[0])
    return y[..., :T].transpose(1, 2)


def l2n(u):
    """u / sqrt(sum u^2 + 1e-6) over the last dim (spec 1.2 step 4)."""
    return u * torch.rsqrt(u.pow(2).sum(-1, keepdim=True) + L2N_EPS)


def recurrent_mixer(x, params, p, kind, cfg, cores):
    """gdn / kaczmarz layer, spec 1.2 with FORMATS.md's fused in_proj, HV = H, W = 4, b_bias on."""
    B, T, _ = x.shape
    H, dk, dv = cfg.lin_heads, cfg.lin_dk, cfg.lin_dv
    m = p + kind + "."
    proj = F.linear(x, params[m + "in_proj.w"])
    qkv, z, a, b = proj.split([2 * H * dk + H * dv, H * dv, H, H], dim=-1)
    qkv = F.silu(causal_depthwise_conv(qkv, params[m + "conv.w"]))
    q, k, v = qkv.split([H * dk, H * dk, H * dv], dim=-1)
    q, k, v = q.view(B, T, H, dk), k.view(B, T, H, dk), v.view(B, T, H, dv)
    q = l2n(q)
    eta = torch.sigmoid(b + params[m + "b_bias"])                          # [B, T, H]
    if kind == "gdn":
        k = l2n(k)
        beta = eta
    else:   # kaczmarz = relaxed_kaczmarz_q_norm (spec 2.2): raw k, beta = eta / (||k||^2 + eps)
        beta = eta / (k.pow(2).sum(-1) + KACZMARZ_EPS)
    g = -torch.exp(params[m + "A_log"]) * F.softplus(a + params[m + "dt_bias"])   # log decay <= 0 (spec 1.2 step 6)
    o = cores.delta_rule(q, k, v, beta, g, dk ** -0.5)                    # [B, T, H, dv]
    # gated output RMSNorm per head, weight shared by the heads (spec 1.2 step 8)
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + ONORM_EPS) * params[m + "onorm.w"]
    y = y * F.silu(z.view(B, T, H, dv))
    return F.linear(y.reshape(B, T, H * dv), params[m + "out_proj.w"])


def precond_mixer(x, params, p, kind, cfg, cores):
    """pdn / pgdn / pkda layer (spec/pdn.md 1.1-1.5, FORMATS.md): fused in_proj, HV = H, W = 4, fast symmetric squash."""
    B, T, _ = x.shape
    H, dk, dv = cfg.lin_heads, cfg.lin_dk, cfg.lin_dv
    m = p + kind + "."
    proj = F.linear(x, params[m + "in_proj.w"])
    qkv, b, aP, bP, *extra = proj.split(precond_split(cfg, kind), dim=-1)
    qkv = F.silu(causal_depthwise_conv(qkv, params[m + "conv.w"]))
    q, k, v = qkv.split([H * dk, H * dk, H * dv], dim=-1)
    q = l2n(q.view(B, T, H, dk)) * dk ** -0.5                              # scaled read query
    k = l2n(k.view(B, T, H, dk))                                           # unit key
    v = v.view(B, T, H, dv)
    beta = torch.sigmoid(b)                                                # [B, T, H]
    gP = -torch.exp(params[m + "A_log_P"]) * F.softplus(aP + params[m + "dt_bias_P"])
    bP = torch.sigmoid(bP)
    if kind == "pdn":
        g = None                                                           # no main decay
    elif kind == "pgdn":
        g = (-torch.exp(params[m + "A_log"]) * F.softplus(extra[0] + params[m + "dt_bias"]))[..., None]
    else:   # pkda: per-channel decay from the low-rank f projection
        f = F.linear(extra[0], params[m + "f2.w"]).view(B, T, H, dk)
        g = -torch.exp(params[m + "A_log"])[:, None] * F.softplus(f + params[m + "dt_bias"].view(H, dk))
    o = cores.precond_delta_rule(q, k, v, beta, g, gP, bP, params[m + "log_scale"], PRECOND_X, PRECOND_EPS)
    # output RMSNorm per head, weight shared by the heads (spec/pdn.md 1.5)
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + PRECOND_ONORM_EPS) * params[m + "onorm.w"]
    if kind == "pkda":
        gate = F.linear(extra[1], params[m + "g2.w"], params[m + "g2.b"])
        y = y * torch.sigmoid(gate.view(B, T, H, dv))
    return F.linear(y.reshape(B, T, H * dv), params[m + "out_proj.w"])


def gka_mixer(x, params, p, cfg, cores):
    """gka layer (spec/gka.md 2.3 with the official defaults of 2.1, FORMATS.md): fused in_proj, Hq = H,
    Hk = Hv = Hkv = gka_kv_heads (GQA when Hkv < H: conv on the un-expanded channels, then k and v repeat-interleaved
    to H heads, spec 2.3 step 3 and 2.4), W = 4, beta gate, alpha connection, conv on v, decay on both H and U,
    s = dk^-1/2, swish-gated output RMSNorm."""
    B, T, _ = x.shape
    H, Hkv, dk, dv = cfg.lin_heads, cfg.gka_kv_heads, cfg.lin_dk, cfg.lin_dv
    m = p + "gka."
    proj = F.linear(x, params[m + "in_proj.w"])
    qkv, gate, a, b, alpha = proj.split(gka_split(cfg), dim=-1)
    qkv = F.silu(causal_depthwise_conv(qkv, params[m + "conv.w"]))
    q, k, v = qkv.split([H * dk, Hkv * dk, Hkv * dv], dim=-1)
    q, k, v = q.view(B, T, H, dk), k.view(B, T, Hkv, dk), v.view(B, T, Hkv, dv)
    if Hkv != H:    # expanded head e reads key/value head e // (H // Hkv); autograd sums the repeated heads' grads
        k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
    q = q / (q.norm(dim=-1, keepdim=True) + GKA_NORM_EPS)                 # eps added to the norm (step 4)
    k = k / (k.norm(dim=-1, keepdim=True) + GKA_NORM_EPS)
    beta = (torch.sigmoid(b + params[m + "b_bias"]) + GKA_BETA_EPS)[..., None]   # write gate (step 5)
    k, v = beta * k, beta * v
    alpha = torch.sigmoid(alpha + params[m + "alpha_bias"])              # [B, T, H] (step 6)
    g = -torch.exp(params[m + "A_log"]) * F.softplus(a + params[m + "dt_bias"])  # log decay <= 0 (step 7)
    o = cores.gka(q, k, v, g, alpha, dk ** -0.5, GKA_RIDGE, GKA_ITERS)    # [B, T, H, dv]
    # gated output RMSNorm per head, weight shared by the heads (step 9)
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + GKA_ONORM_EPS) * params[m + "onorm.w"]
    y = y * F.silu(gate.view(B, T, H, dv))
    return F.linear(y.reshape(B, T, H * dv), params[m + "out_proj.w"])


def kalman_dynamics(params, m):
    """Static per-(d, n) dynamics of a kalman layer (spec/kalman.md 1.3 step 6, OU discretisation):
    Delta = softplus(delta_raw) + 1e-7; kappa = exp(lambda_log); abar = exp(-kappa Delta);
    pbar = max(max(p_raw, 1e-7) / (2 kappa) * -expm1(-2 kappa Delta), 1e-12). Returns abar, pbar [Dk, N]."""
    delta = F.softplus(params[m + "delta_raw"]) + KALMAN_DELTA_MIN
    kappa = torch.exp(params[m + "lambda_log"])
    abar = torch.exp(-kappa * delta)
    p = torch.clamp(params[m + "p_raw"], min=KALMAN_P_MIN)
    pbar = torch.clamp(p / (2.0 * kappa) * -torch.expm1(-2.0 * kappa * delta), min=KALMAN_FLOOR)
    return abar, pbar


def kalman_mixer(x, params, p, cfg, cores):
    """kalman layer (spec/kalman.md 1.3 equations (1)-(8), FORMATS.md), plain or mamba preset, no variance output."""
    Dk = cfg.kalman_expand * cfg.n_embd
    m = p + "kalman."
    z0, gate = F.linear(x, params[m + "in_proj.w"]).split(Dk, dim=-1)                  # (1)
    u = F.silu(causal_depthwise_conv(z0, params[m + "conv.w"]) + params[m + "conv.b"])  # (2)
    s = F.linear(u, params[m + "sensor.w"])                                             # (3)
    if cfg.kalman_preset == "plain":
        v, ls, kr, qr = s.split(kalman_split(cfg), dim=-1)
    else:   # mamba: v = u, low-rank log-variance lifted by var.w
        ls_r, kr, qr = s.split(kalman_split(cfg), dim=-1)
        v, ls = u, F.linear(ls_r, params[m + "var.w"])
    k = kr / torch.clamp(kr.norm(dim=-1, keepdim=True), min=KALMAN_FLOOR)               # (4)
    q = qr / torch.clamp(qr.norm(dim=-1, keepdim=True), min=KALMAN_FLOOR)
    Lv = 1.0 / (F.softplus(ls) + KALMAN_OBS_VAR_MIN)                                    # (5)
    abar, pbar = kalman_dynamics(params, m)                                             # (6)
    y_s = cores.kalman(v, Lv, k, q, abar, pbar)                                         # (7)
    y1 = y_s + params[m + "lambda_skip"] * u                                            # (8)
    return F.linear(y1 * F.silu(gate), params[m + "out_proj.w"])


def mlp(x, params, p, cfg):
    """GELU: proj(GELU_tanh(fc(x))) with biases; SwiGLU: proj(SiLU(gate) * up), [gate | up] = fc(x), no biases."""
    if cfg.mlp == "gelu":
        h = F.gelu(F.linear(x, params[p + "fc.w"], params[p + "fc.b"]), approximate="tanh")
        return F.linear(h, params[p + "proj.w"], params[p + "proj.b"])
    gate, up = F.linear(x, params[p + "fc.w"]).split(cfg.mlp_hidden, dim=-1)
    return F.linear(F.silu(gate) * up, params[p + "proj.w"])


def forward(params, cfg, idx, cores=REFERENCE_CORES):
    """idx: [B, T] token ids -> logits [B, T, Vp] (LNf(x) @ wte^T, the tied LM head)."""
    x = params["wte"][idx]
    if has_wpe(cfg):
        x = x + params["wpe"][: idx.shape[1]]
    for l, mixer in enumerate(cfg.mixers):
        p = f"h{l}."
        h = norm(x, params, p + "ln1.", cfg)
        if mixer == "attn":
            x = x + attention_mixer(h, params, p, cfg, cores)
        elif mixer in PRECOND_MIXERS:
            x = x + precond_mixer(h, params, p, mixer, cfg, cores)
        elif mixer == "gka":
            x = x + gka_mixer(h, params, p, cfg, cores)
        elif mixer == "kalman":
            x = x + kalman_mixer(h, params, p, cfg, cores)
        else:
            x = x + recurrent_mixer(h, params, p, mixer, cfg, cores)
        if cfg.mlp != "none":
            x = x + mlp(norm(x, params, p + "ln2.", cfg), params, p + "mlp.", cfg)
    return norm(x, params, "lnf.", cfg) @ params["wte"].t()


def cross_entropy_loss(logits, targets, vocab_size):
    """Mean softmax cross-entropy over the first V (unpadded) logit columns."""
    return F.cross_entropy(logits[..., :vocab_size].reshape(-1, vocab_size), targets.reshape(-1))


# ----------------------------------------------------------------------------------------------------------------
# optimiser: global-norm clipping then AdamW, written out (FORMATS.md "Debug state")


Hyper = collections.namedtuple("Hyper", "lr beta1 beta2 eps weight_decay grad_clip")


def clip_scale(grads, grad_clip):
    """(global gradient norm, clipping scale): scale = grad_clip / norm if norm > grad_clip else 1."""
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values())).item()
    return norm, (grad_clip / norm if norm > grad_clip else 1.0)


@torch.no_grad()
def adamw_update(params, grads, m, v, step, hp, scale):
    """One AdamW step (step counts from 0) on the clipped gradients scale * g, in the compute dtype:
    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr_p (mhat / (sqrt(vhat) + eps) + wd_p p),
    lr_p = lr times the tensor's learning-rate group (0.1 for kalman's state-space parameters, else 1)."""
    t = step + 1
    for name, p in params.items():
        g = grads[name] * scale
        m[name].mul_(hp.beta1).add_((1 - hp.beta1) * g)
        v[name].mul_(hp.beta2).add_((1 - hp.beta2) * g * g)
        mhat = m[name] / (1 - hp.beta1 ** t)
        vhat = v[name] / (1 - hp.beta2 ** t)
        wd = hp.weight_decay if is_decayed(name) else 0.0
        p.sub_(hp.lr * lr_scale(name) * (mhat / (vhat.sqrt() + hp.eps) + wd * p))


# ----------------------------------------------------------------------------------------------------------------
# file writing (little-endian, FORMATS.md)


def le_bytes(t, dtype=torch.float32):
    """Raw little-endian bytes of a tensor stored as float32 or int32 (pure torch + array, numpy not needed)."""
    a = array.array("f" if dtype == torch.float32 else "i", t.detach().to("cpu", dtype).reshape(-1).tolist())
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def header_bytes(ints, floats):
    """256 int32 slots: ints {slot: int}, floats {slot: float stored bit-for-bit as float32}."""
    slots = [0] * HEADER_SLOTS
    for slot, value in ints.items():
        slots[slot] = value
    for slot, value in floats.items():
        slots[slot] = struct.unpack("<i", struct.pack("<f", value))[0]
    return struct.pack(f"<{HEADER_SLOTS}i", *slots)


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


CRC32C_TABLE = _crc32c_table()


def _crc32c_register(reg, data):
    """The CRC32C register after the bytes of data, from register reg (no pre/post inversion), byte by byte."""
    for b in data:
        reg = CRC32C_TABLE[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def crc32c(data):
    """CRC32C (Castagnoli) of bytes, FORMATS.md "Checksums"; train_kla.c has its own (utils.h). Long data is cut into
    equal lanes whose registers advance together as one torch tensor (pure Python would take minutes for a model):
    the register update is linear over GF(2), so reg(s, A ++ B) = Z(reg(s, A)) ^ reg(0, B), where Z is the linear
    map "advance over len(B) zero bytes", applied here through four 256-entry tables built from its 32 basis images."""
    n = len(data)
    lanes = min(16384, n // 256)
    if lanes < 16:
        return _crc32c_register(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    lane_len = n // lanes
    table = torch.tensor(CRC32C_TABLE, dtype=torch.int64)
    body = torch.frombuffer(bytearray(data[:lanes * lane_len]), dtype=torch.uint8).view(lanes, lane_len).to(torch.int64)
    regs = torch.zeros(lanes, dtype=torch.int64)
    basis = torch.tensor([1 << k for k in range(32)], dtype=torch.int64)
    for j in range(lane_len):
        regs = table[(regs ^ body[:, j]) & 0xFF] ^ (regs >> 8)
        basis = table[basis & 0xFF] ^ (basis >> 8)
    basis = basis.tolist()
    zero_advance = []                   # zero_advance[b][v]: Z applied to the register value v << 8b
    for b in range(4):
        row = []
        for v in range(256):
            out = 0
            for k in range(8):
                if v >> k & 1:
                    out ^= basis[8 * b + k]
            row.append(out)
        zero_advance.append(row)
    reg = 0xFFFFFFFF
    for r in regs.tolist():
        reg = (zero_advance[0][reg & 0xFF] ^ zero_advance[1][reg >> 8 & 0xFF] ^ zero_advance[2][reg >> 16 & 0xFF]
               ^ zero_advance[3][reg >> 24] ^ r)
    return _crc32c_register(reg, data[lanes * lane_len:]) ^ 0xFFFFFFFF


def write_atomically(path, chunks):
    """Write the byte chunks to path.tmp, then rename, so no partial file is left behind."""
    with open(path + ".tmp", "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    os.replace(path + ".tmp", path)


def write_checkpoint(path, cfg, params):
    """FORMATS.md "Model checkpoint": header, tensor table, fp32 payload in table order."""
    shapes = tensor_shapes(cfg)
    payload_offset = HEADER_SLOTS * 4 + TABLE_ENTRY_BYTES * len(shapes)
    header = bytearray(header_bytes(
        {0: CHECKPOINT_MAGIC, 1: CHECKPOINT_VERSION, 2: cfg.vocab_size, 3: cfg.padded_vocab_size,
         4: cfg.max_seq_len, 5: len(cfg.mixers), 6: cfg.n_embd, 7: cfg.n_head, 8: cfg.lin_heads,
         9: cfg.lin_dk, 10: cfg.lin_dv, 11: CONV_SIZE, 12: len(shapes), 13: 0,
         14: payload_offset & 0xFFFFFFFF, 15: payload_offset >> 32,
         20: NORMS.index(cfg.norm), 21: MLPS.index(cfg.mlp), 22: cfg.mlp_hidden, 26: GKA_ITERS,
         29: cfg.kalman_expand, 30: cfg.kalman_n, 31: KALMAN_PRESETS.index(cfg.kalman_preset),
         32: cfg.kalman_rank, 33: cfg.gka_kv_heads},
        {16: cfg.norm_eps, 17: L2N_EPS, 18: ONORM_EPS, 19: KACZMARZ_EPS,
         23: PRECOND_X, 24: PRECOND_EPS, 25: PRECOND_ONORM_EPS, 27: GKA_RIDGE, 28: GKA_ONORM_EPS}))
    pattern = canonical_pattern(cfg.mixers).encode("ascii")
    header[PATTERN_OFFSET:PATTERN_OFFSET + len(pattern)] = pattern       # rest of the area stays NUL
    table, payload, offset = [], [], 0
    for name, shape in shapes:
        dims = list(shape) + [0] * (4 - len(shape))
        payload.append(le_bytes(params[name]))
        table.append(struct.pack(f"<{TABLE_NAME_BYTES}sIii4iq", name.encode("ascii"), crc32c(payload[-1]), 0, len(shape),
                                 *dims, offset))
        offset += 4 * math.prod(shape)
    header[4 * CHECKSUM_SLOT:4 * CHECKSUM_SLOT + 4] = struct.pack("<I", crc32c(bytes(header) + b"".join(table)))
    write_atomically(path, [bytes(header)] + table + payload)


def write_debug_state(path, cfg, hp, x, y, logits, loss, grads, losses):
    """FORMATS.md "Debug state": header, x, y, unpadded logits, loss, gradients (checkpoint order), losses."""
    B, T = x.shape
    header = header_bytes(
        {0: DEBUG_MAGIC, 1: DEBUG_VERSION, 2: B, 3: T, 4: cfg.vocab_size, 5: cfg.padded_vocab_size,
         6: len(losses), 7: len(grads)},
        {8: hp.lr, 9: hp.beta1, 10: hp.beta2, 11: hp.eps, 12: hp.weight_decay, 13: hp.grad_clip})
    chunks = [header, le_bytes(x, torch.int32), le_bytes(y, torch.int32),
              le_bytes(logits[..., :cfg.vocab_size]), struct.pack("<f", loss)]
    chunks += [le_bytes(grads[name]) for name, _ in tensor_shapes(cfg)]
    chunks.append(struct.pack(f"<{len(losses)}f", *losses))
    write_atomically(path, chunks)


# ----------------------------------------------------------------------------------------------------------------
# command line


def add_model_args(parser, max_seq_len):
    """The model flags, shared with scripts/bench_cpu.py; defaults as train_kla.c's except --max-seq-len."""
    parser.add_argument("--mixer", default="gdn", help="per-layer mixer pattern name[:count],... with names attn, "
                                                       "gdn, kaczmarz, pdn, pgdn, pkda, gka, kalman, e.g. attn:2,gdn:1,pdn:1")
    parser.add_argument("--depth", type=int, help="number of layers; must equal the pattern's (default: that)")
    parser.add_argument("--width", type=int, default=128, help="model width C")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (head size C / heads)")
    parser.add_argument("--lin-heads", type=int, default=0, help="heads H of the recurrent mixers (0: heads/2, at least 1)")
    parser.add_argument("--dk", type=int, default=0, help="key/query head dim of the recurrent mixers (0: 2*width/heads)")
    parser.add_argument("--dv", type=int, default=0, help="value head dim of the recurrent mixers (0: dk)")
    parser.add_argument("--gka-kv-heads", type=int, default=0,
                        help="key/value heads Hkv of gka (GQA when < lin-heads; must divide it; 0: lin-heads)")
    parser.add_argument("--max-seq-len", type=int, default=max_seq_len, help="rows of wpe (all-attn models)")
    parser.add_argument("--vocab-size", type=int, default=50257, help="vocabulary size V")
    parser.add_argument("--norm", choices=NORMS, default="layernorm",
                        help="block and final norm: LayerNorm with bias (GPT-2) or RMSNorm without bias")
    parser.add_argument("--norm-eps", type=float, default=NORM_EPS, help="eps of the block and final norms")
    parser.add_argument("--mlp", choices=MLPS, default="gelu",
                        help="MLP: GELU (GPT-2), SwiGLU (no biases) or none (no MLP and no second norm)")
    parser.add_argument("--mlp-hidden", type=int, default=0, help="MLP hidden width (0: GELU 4C, SwiGLU "
                                                                  "256*ceil(floor(8C/3)/256))")
    parser.add_argument("--kalman-expand", type=int, default=1, help="kalman inner width Dk = expand * width")
    parser.add_argument("--kalman-n", type=int, default=16, help="kalman state expansion N per channel")
    parser.add_argument("--kalman-preset", choices=KALMAN_PRESETS, default="plain",
                        help="kalman sensor map: plain (full v and log-variance projections) or mamba (v = u, "
                             "low-rank log-variance of rank ceil(width/8))")
    parser.add_argument("--seed", type=int, default=1337, help="seed of the initial weights and of the tokens")


def config_from_args(args, parser):
    """Config from the model flags; parser.error (exit 2 with a message) on inconsistent values."""
    try:
        mixers = parse_pattern(args.mixer)
    except ValueError as e:
        parser.error(str(e))
    if args.depth is not None and args.depth != len(mixers):
        parser.error(f"mixer pattern '{args.mixer}' has {len(mixers)} layers but --depth is {args.depth}")
    if len(canonical_pattern(mixers)) >= HEADER_SLOTS * 4 - PATTERN_OFFSET:
        parser.error(f"mixer pattern '{args.mixer}' does not fit the checkpoint header (511 characters)")
    for flag in ("width", "heads", "max_seq_len", "vocab_size", "kalman_expand", "kalman_n"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    for flag in ("lin_heads", "dk", "dv", "gka_kv_heads"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be positive, or 0 for the default")
    if args.mlp_hidden < 0:
        parser.error("--mlp-hidden must be positive, or 0 for the default")
    if args.mlp == "none" and args.mlp_hidden:
        parser.error("--mlp-hidden makes no sense with --mlp none")
    if not args.norm_eps > 0:
        parser.error("--norm-eps must be positive")
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    dk = args.dk or 2 * args.width // args.heads
    lin_heads = args.lin_heads or max(args.heads // 2, 1)
    gka_kv_heads = args.gka_kv_heads or lin_heads
    if gka_kv_heads > lin_heads or lin_heads % gka_kv_heads:
        parser.error(f"--gka-kv-heads {gka_kv_heads} does not divide the {lin_heads} lin heads")
    cfg = Config(vocab_size=args.vocab_size, padded_vocab_size=(args.vocab_size + 127) // 128 * 128,
                 max_seq_len=args.max_seq_len, mixers=mixers, n_embd=args.width, n_head=args.heads,
                 lin_heads=lin_heads, lin_dk=dk, lin_dv=args.dv or dk,
                 norm=args.norm, mlp=args.mlp, mlp_hidden=args.mlp_hidden or default_mlp_hidden(args.mlp, args.width),
                 norm_eps=args.norm_eps, kalman_expand=args.kalman_expand, kalman_n=args.kalman_n,
                 kalman_preset=args.kalman_preset,
                 kalman_rank=-(-args.width // 8) if args.kalman_preset == "mamba" else 0, gka_kv_heads=gka_kv_heads)
    if has_wpe(cfg) and args.T > cfg.max_seq_len:
        parser.error(f"--T {args.T} exceeds --max-seq-len {cfg.max_seq_len} (the all-attn model has wpe)")
    return cfg


def parse_args():
    parser = argparse.ArgumentParser(description="train_kla PyTorch reference: writes PREFIX_model.bin and "
                                                 "PREFIX_debug.bin (FORMATS.md)")
    add_model_args(parser, max_seq_len=64)
    parser.add_argument("--B", type=int, default=2, help="batch size")
    parser.add_argument("--T", type=int, default=64, help="sequence length")
    parser.add_argument("--steps", type=int, default=10, help="training steps on the same batch")
    parser.add_argument("--lr", type=float, default=1e-3, help="constant learning rate")
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--adam-eps", type=float, default=1e-8)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--out", required=True, help="output prefix: writes PREFIX_model.bin and PREFIX_debug.bin")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="compute dtype")
    args = parser.parse_args()
    if args.B < 1 or args.T < 1 or args.steps < 1:
        parser.error("--B, --T and --steps must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    return args, config_from_args(args, parser)


def train_on_batch(params, cfg, hp, x, y, steps):
    """Train `steps` steps on the batch (x, y) in place. Returns the step-0 (logits, grads, grad norm) and the loss
    of every step, each taken before that step's update."""
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    losses = []
    for step in range(steps):
        logits = forward(params, cfg, x)
        loss = cross_entropy_loss(logits, y, cfg.vocab_size)
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
        losses.append(loss.item())
        norm, scale = clip_scale(grads, hp.grad_clip)
        if step == 0:
            first = (logits.detach(), grads, norm)
        adamw_update(params, grads, m, v, step, hp, scale)
    return first + (losses,)


def main():
    args, cfg = parse_args()
    hp = Hyper(args.lr, args.beta1, args.beta2, args.adam_eps, args.weight_decay, args.grad_clip)

    # initial weights, then the batch (x = tokens[:, :-1], y = tokens[:, 1:]), all from one CPU generator
    gen = torch.Generator().manual_seed(args.seed)
    weights = init_params(cfg, gen)
    tokens = torch.randint(0, cfg.vocab_size, (args.B, args.T + 1), generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]

    # compute in --dtype from the fp32 weights cast up (copies: `weights` stays the initial checkpoint)
    params = {n: w.to(args.device, getattr(torch, args.dtype), copy=True).requires_grad_() for n, w in weights.items()}
    logits, grads, norm, losses = train_on_batch(params, cfg, hp, x.to(args.device), y.to(args.device), args.steps)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_checkpoint(args.out + "_model.bin", cfg, weights)
    write_debug_state(args.out + "_debug.bin", cfg, hp, x, y, logits, losses[0], grads, losses)
    nparams = sum(w.numel() for w in weights.values())
    print(f"{canonical_pattern(cfg.mixers)} L={len(cfg.mixers)} C={cfg.n_embd} norm={cfg.norm} mlp={cfg.mlp}"
          f"({cfg.mlp_hidden}) params={nparams} "
          f"B={args.B} T={args.T} seed={args.seed} {args.dtype} on {args.device}")
    print(f"step 0: loss {losses[0]:.6f}  grad norm {norm:.6f}")
    print("losses: " + " ".join(f"{l:.6f}" for l in losses))
    print(f"wrote {args.out}_model.bin and {args.out}_debug.bin")

if __name__ == "__main__":
    main()
