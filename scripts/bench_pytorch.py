"""PyTorch's training step for the swin.c benchmark: timm's Swin of the same size, on the same GPU,
same batch and precision, fused AdamW, label smoothing 0.1 and the recipe's drop path, measured the
way `swin_train bench=1` measures swin.c (warm-up, then the median of rounds of 10 steps, each round
timed between two synchronizations; peak memory from torch.cuda.max_memory_allocated).

Usage: python3 scripts/bench_pytorch.py MODEL BATCH MODE [MODE ...]
  MODEL: swin_tiny | swin_small | swin_base | swin_large (timm's *_patch4_window7_224), or
         swin_base_384 | swin_large_384 (timm's *_patch4_window12_384, 384-pixel input), or
         swinv2_tiny_256 | swinv2_base_256 (timm's swinv2_tiny_window8_256, swinv2_base_window16_256)
  MODE:  eager          timm's attention as written (matmul, softmax, matmul)
         eager_fused    TIMM_FUSED_ATTN=2: timm calls F.scaled_dot_product_attention (V2, whose
                        timm attention has no fused path: the cosine scores through
                        F.scaled_dot_product_attention with the position bias and mask as its
                        float attn_mask, scale 1)
         compile_fused  torch.compile of the model with fused attention
         compile_fused_ro   the same with mode='reduce-overhead' (CUDA graphs)
         compile_flex   torch.compile with the window attention through FlexAttention, the
                        relative-position bias and the shift mask added by a score_mod (V2: the
                        cosine q and k, the continuous position bias in the score_mod)
Each mode runs in its own process (timm reads TIMM_FUSED_ATTN when it is imported) and prints one
JSON line: {"bench": "pytorch", "model", "mode", "batch", "img_s", "ms_per_step", "peak_gib"}.
"""
import json
import os
import statistics
import subprocess
import sys
import time

# timm model, input side, drop path (the recipe configs' model.drop_path)
MODELS = {"swin_tiny": ("swin_tiny_patch4_window7_224", 224, 0.2),
          "swin_small": ("swin_small_patch4_window7_224", 224, 0.3),
          "swin_base": ("swin_base_patch4_window7_224", 224, 0.5),
          "swin_large": ("swin_large_patch4_window7_224", 224, 0.5),
          "swin_base_384": ("swin_base_patch4_window12_384", 384, 0.5),
          "swin_large_384": ("swin_large_patch4_window12_384", 384, 0.2),
          "swinv2_tiny_256": ("swinv2_tiny_window8_256", 256, 0.2),
          "swinv2_base_256": ("swinv2_base_window16_256", 256, 0.5)}
ROUND, ROUNDS, WARMUP = 10, 5, 15


def timm_fused_attn(mode):
    """TIMM_FUSED_ATTN for a mode (timm reads it when it is imported): timm marks Swin's
    F.scaled_dot_product_attention path experimental, so only 2 turns it on; 0 keeps the
    matmul, softmax, matmul."""
    return "0" if mode == "eager" else "2"


def use_flex_attention():
    """Replaces timm's window attention by FlexAttention: scores + bias[h, q, k] (+ the shifted
    windows' mask[window, q, k]) in a score_mod; the rest of the forward is timm's."""
    import timm.models.swin_transformer as swin
    from torch.nn.attention.flex_attention import flex_attention

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        bias = self._get_rel_pos_bias()[0]  # (heads, N, N)
        if mask is None:
            def score_mod(score, b, h, qi, ki):
                return score + bias[h, qi, ki]
        else:
            num_win = mask.shape[0]  # batch index b of a window = image * num_win + window

            def score_mod(score, b, h, qi, ki):
                return score + bias[h, qi, ki] + mask[b % num_win, qi, ki]
        x = flex_attention(q, k, v, score_mod=score_mod)
        x = x.transpose(1, 2).reshape(B_, N, -1)
        return self.proj_drop(self.proj(x))

    swin.WindowAttention.forward = forward


def v2_attention(flex):
    """Replaces timm's V2 window attention forward: the same cosine scores, logit scale and
    16 * sigmoid(cpb_mlp) bias, through FlexAttention (flex) or F.scaled_dot_product_attention with
    the bias and mask as a float attn_mask; both with scale 1 (q carries the logit scale)."""
    import math
    import torch
    import torch.nn.functional as F
    import timm.models.swin_transformer_v2 as v2
    from torch.nn.attention.flex_attention import flex_attention

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        bias = None
        if self.q_bias is not None:
            bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias).reshape(B_, N, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        scale = torch.clamp(self.logit_scale, max=math.log(1. / 0.01)).exp()
        q = (F.normalize(q, dim=-1) * scale).to(v.dtype)  # the fp32 scale would promote q
        k = F.normalize(k, dim=-1)
        table = self.cpb_mlp(self.relative_coords_table).view(-1, self.num_heads)
        rel = table[self.relative_position_index.view(-1)].view(N, N, -1).permute(2, 0, 1)
        rel = 16 * torch.sigmoid(rel)  # (heads, N, N)
        if flex:
            if mask is None:
                def score_mod(score, b, h, qi, ki):
                    return score + rel[h, qi, ki]
            else:
                num_win = mask.shape[0]

                def score_mod(score, b, h, qi, ki):
                    return score + rel[h, qi, ki] + mask[b % num_win, qi, ki]
            out = flex_attention(q, k, v, score_mod=score_mod, scale=1.0)
        else:
            attn_mask = rel.unsqueeze(0).to(q.dtype)
            if mask is not None:
                num_win = mask.shape[0]
                attn_mask = (rel.unsqueeze(0) + mask.unsqueeze(1)).to(q.dtype)  # (nW, h, N, N)
                attn_mask = attn_mask.repeat(B_ // num_win, 1, 1, 1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=1.0)
        out = out.transpose(1, 2).reshape(B_, N, -1)
        return self.proj_drop(self.proj(out))

    original = v2.WindowAttention.forward
    v2.WindowAttention.forward = forward
    return original


def check_same_as_timm(net, original, side):
    """The replaced V2 attention gives timm's logits (fp32, 2 images, drop path off). timm starts
    the res-post-norms at zero, where the attention does not reach the logits: the check runs
    with them at one, and puts them back."""
    import torch
    import timm.models.swin_transformer_v2 as v2
    x = torch.randn(2, 3, side, side, device="cuda")
    norms = [p for n, p in net.named_parameters() if n.endswith(("norm1.weight", "norm2.weight"))]
    saved = [p.detach().clone() for p in norms]
    net.eval()
    with torch.no_grad():
        for p in norms:
            p.fill_(1.0)
        ours = net(x)
        replaced = v2.WindowAttention.forward
        v2.WindowAttention.forward = original
        ref = net(x)
        v2.WindowAttention.forward = replaced
        for p, v in zip(norms, saved):
            p.copy_(v)
    net.train()
    err = ((ours - ref).abs().max() / ref.abs().max()).item()
    # TF32 matmuls on both sides: ~1e-3; a wrong bias, scale or mask is O(1).
    assert err < 2e-2, f"the replaced V2 attention differs from timm's by {err:.3g} (relative)"
    print(f"replaced V2 attention vs timm: {err:.2e} relative (TF32)", file=sys.stderr)


def run_mode(model, batch, mode):
    import torch
    import timm

    original = None
    if model.startswith("swinv2") and mode != "eager":
        original = v2_attention(flex=mode == "compile_flex")
    elif mode == "compile_flex":
        use_flex_attention()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    name, side, drop_path = MODELS[model]
    net = timm.create_model(name, num_classes=1000, drop_path_rate=drop_path).cuda().train()
    if original is not None:
        check_same_as_timm(net, original, side)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    lossf = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(batch, 3, side, side, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    fwd = net
    if mode in ("compile_fused", "compile_flex"):
        fwd = torch.compile(net)
    elif mode == "compile_fused_ro":
        fwd = torch.compile(net, mode="reduce-overhead")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(ROUND):
            step()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e3 / ROUND)
    ms = statistics.median(rounds)
    print(json.dumps({"bench": "pytorch", "model": model, "mode": mode, "batch": batch,
                      "img_s": round(batch * 1e3 / ms, 1), "ms_per_step": round(ms, 3),
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                      "torch": torch.__version__, "timm": timm.__version__}), flush=True)


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "--one":
        run_mode(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model, batch, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for mode in modes:
        env = dict(os.environ, TIMM_FUSED_ATTN=timm_fused_attn(mode))
        subprocess.run([sys.executable, __file__, "--one", model, str(batch), mode], env=env,
                       check=False)


if __name__ == "__main__":
    main()
