"""
bench_gpu_peer.py: the PyTorch peer of the GPU benchmark of train_kla (scripts/bench_gpu.sh).

Times one full training step (forward, backward, global-norm clipping, AdamW) of GPT-2 124M on one GPU with
PyTorch at its best: bf16 autocast, torch.compile, F.scaled_dot_product_attention (flash attention), fused AdamW,
TF32 for what autocast leaves in fp32. The model is train_kla's all-attn model (FORMATS.md) written out here:
vocab 50257 padded to 50304 in the embedding (the softmax covers the first 50257 logits only), 12 layers, width 768,
12 heads, learned position embedding, pre-norm LayerNorm (eps 1e-5), GELU(tanh) MLP 4x, GPT-2 biases, LM head
tied to the token embedding. Inputs are random tokens (no data needed); the same batch is used every step.

Prints exactly one line:
    peer | attn | B 16 | T 1024 | ms/step 31.85 | tok/s 514400 | peak mem 12345 MiB
--steps steps are run and the first --warmup of them (which include the compilation) are not timed, as train_klacu
-x 30 times the steps after its first 10: ms/step is the mean over the other --steps - --warmup steps (wall clock,
time.perf_counter between torch.cuda.synchronize calls). peak mem is torch.cuda.max_memory_allocated over the run.

Example:
    python3 scripts/bench_gpu_peer.py --B 16 --T 1024
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, PADDED_VOCAB = 50257, 50304      # GPT-2's vocabulary, rounded up to a multiple of 128 (FORMATS.md)
DEPTH, WIDTH, HEADS = 12, 768, 12       # GPT-2 124M
NORM_EPS = 1e-5
# AdamW and clipping (GPT-2 124M's usual values; they do not change the timing)
LR, BETAS, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 6e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


class Block(nn.Module):
    """One pre-norm GPT-2 layer: x += attn(LN1(x)); x += MLP(LN2(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, eps=NORM_EPS)
        self.qkv = nn.Linear(width, 3 * width)          # rows [q | k | v], with bias
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width, eps=NORM_EPS)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        # [B, T, C] -> [B, heads, T, C / heads]; SDPA scales by 1/sqrt(head size) and applies the causal mask
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """Token + position embedding, DEPTH blocks, final LayerNorm, LM head tied to the token embedding."""

    def __init__(self, max_seq_len):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, WIDTH)
        self.wpe = nn.Embedding(max_seq_len, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(DEPTH))
        self.ln_f = nn.LayerNorm(WIDTH, eps=NORM_EPS)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """FORMATS.md: matrices and embeddings N(0, 0.02), residual output projections N(0, 0.02/sqrt(2L)),
        biases 0, LayerNorm weights 1; the padding rows V..Vp-1 of wte are zero."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * DEPTH) if name.endswith("proj.weight") else 0.02
                p.normal_(0.0, std)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
        self.wte.weight[VOCAB:].zero_()

    def forward(self, idx, targets):
        """Mean softmax cross-entropy over the first VOCAB logits of every position."""
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight).float()  # [B, T, PADDED_VOCAB]
        # softmax over the first VOCAB columns only: the padding columns are set to -inf, which gives the same loss
        # and gradients as slicing them off (zero gradient there) and is about 4% faster per step under
        # torch.compile (the slice's backward writes a padded copy of the logit gradients)
        padding = torch.arange(PADDED_VOCAB, device=idx.device) >= VOCAB
        return F.cross_entropy(logits.masked_fill(padding, float("-inf")).flatten(0, 1), targets.flatten())


def allow_tf32():
    """TF32 tensor cores for fp32 matmuls/convolutions (torch >= 2.9 spells it fp32_precision; older allow_tf32)."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def make_adamw(model):
    """Fused AdamW; weight decay on the 2-D weights except the embeddings (FORMATS.md), none elsewhere."""
    decayed = {n: p.dim() == 2 and not n.startswith(("wte", "wpe")) for n, p in model.named_parameters()}
    groups = [{"params": [p for n, p in model.named_parameters() if decayed[n]], "weight_decay": WEIGHT_DECAY},
              {"params": [p for n, p in model.named_parameters() if not decayed[n]], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=ADAM_EPS, fused=True)


def train_step(model, optimizer, x, y):
    """forward + backward (bf16 autocast) + global-norm clipping + AdamW, as one step of train_kla."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()


def main():
    parser = argparse.ArgumentParser(description="PyTorch peer of train_kla's GPU benchmark: GPT-2 124M, bf16")
    parser.add_argument("--B", type=int, default=16, help="batch size")
    parser.add_argument("--T", type=int, default=1024, help="sequence length")
    parser.add_argument("--steps", type=int, default=30, help="steps in all, warm-up included")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation included)")
    parser.add_argument("--max-seq-len", type=int, default=0,
                        help="position-embedding rows (0 = max(T, 1024)); bench_gpu.sh passes train_klacu's value")
    args = parser.parse_args()
    if min(args.B, args.T) < 1 or args.warmup < 0 or args.steps <= args.warmup:
        parser.error("--B and --T must be positive, --warmup non-negative and below --steps")
    max_seq_len = args.max_seq_len or max(args.T, 1024)
    if max_seq_len < args.T:
        parser.error(f"--max-seq-len {max_seq_len} is below --T {args.T}")
    if not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch")

    allow_tf32()
    torch.manual_seed(1337)
    device = torch.device("cuda")
    model = GPT2(max_seq_len).to(device)
    optimizer = make_adamw(model)
    model = torch.compile(model)
    tokens = torch.randint(0, VOCAB, (args.B, args.T + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    for _ in range(args.warmup):
        train_step(model, optimizer, x, y)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps - args.warmup):
        train_step(model, optimizer, x, y)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / (args.steps - args.warmup)
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    print(f"peer | attn | B {args.B} | T {args.T} | ms/step {seconds * 1000:.2f} | "
          f"tok/s {args.B * args.T / seconds:.0f} | peak mem {peak_mib:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
