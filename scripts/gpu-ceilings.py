"""The two ceilings of the GPU this runs on, measured with PyTorch: device-to-device copy
bandwidth (bytes read + written) and the bf16 matrix-product rate on random data."""
import torch

def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    ts.sort()
    return ts[len(ts) // 2]

n = 1 << 30  # 4 GiB of floats... as bytes: 1 Gi float32 = 4 GiB
src = torch.rand(n // 4 * 2, device="cuda")  # 2 GiB
dst = torch.empty_like(src)
t = timed(lambda: dst.copy_(src))
print(f"ceiling: copy {2 * src.numel() * 4 / t / 1e12:.2f} TB/s (read + write, {src.numel() * 4 / 2**30:.0f} GiB)")
del src, dst
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = timed(lambda: a @ b)
print(f"ceiling: bf16 matmul 8192^3 {2 * 8192**3 / t / 1e12:.0f} TFLOP/s")
