"""Anchor: timm Swin training throughput on one GPU (PyTorch), for the side-by-side ratio with swin.c.
Usage: python3 anchor_pytorch.py [timm model name] [batch] [modes: fp32 bf16 fp16 bf16c ...]
Prints one JSON line per mode (img_s, ms_per_step, peak_gib); bf16c is bf16 with torch.compile, bf16m with mode max-autotune-no-cudagraphs."""
import sys, time, json, os
import torch, timm

def run(model_name, batch, mode, steps=30, warm=10):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = mode != 'fp32'
    torch.backends.cudnn.allow_tf32 = mode != 'fp32'
    m = timm.create_model(model_name, num_classes=1000, drop_path_rate=0.2).cuda().train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    x = torch.randn(batch, 3, 224, 224, device='cuda')
    y = torch.randint(0, 1000, (batch,), device='cuda')
    lossf = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    dtype = {'fp32': None, 'tf32': None, 'bf16': torch.bfloat16, 'bf16c': torch.bfloat16, 'bf16m': torch.bfloat16, 'fp16': torch.float16}[mode]
    scaler = torch.amp.GradScaler('cuda', enabled=(mode == 'fp16'))
    fwd = {'bf16c': lambda: torch.compile(m), 'bf16m': lambda: torch.compile(m, mode='max-autotune-no-cudagraphs')}.get(mode, lambda: m)()
    def step():
        with torch.autocast('cuda', dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = lossf(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt); scaler.update()
        return loss
    t0 = time.time()
    for _ in range(warm): step()
    torch.cuda.synchronize(); tw = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(steps): l = step()
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / steps
    r = dict(model=model_name, batch=batch, mode=mode, ms_per_step=round(ms, 2),
             img_s=round(batch * 1000 / ms, 1), peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
             warm_s=round(tw, 1), loss=float(l.detach()))
    print(json.dumps(r), flush=True)
    del m, opt, fwd
    torch.cuda.empty_cache()
    return r

if __name__ == '__main__':
    name = sys.argv[1] if len(sys.argv) > 1 else 'swin_tiny_patch4_window7_224'
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    modes = sys.argv[3:] or ['fp32', 'bf16', 'fp16', 'bf16c']
    print(torch.__version__, timm.__version__, torch.cuda.get_device_name(), flush=True)
    out = [run(name, batch, md) for md in modes]
    if os.environ.get('OUT'):
        with open(os.path.join(os.environ['OUT'], f'anchor_{name}_{batch}.jsonl'), 'a') as f:
            for r in out: f.write(json.dumps(r) + '\n')
