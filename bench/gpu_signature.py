"""GPU signature benchmark (run on a CUDA machine; scripts/gpu_check.sh calls it).

Times, side by side in one process on one buffer:
  ours      lm_resiliency.signature (CUDA kernel + 16-byte read-back, end to end)
  copy      device-to-device copy of the same bytes (the hardware reference)
  read      a torch reduction that only reads the bytes (int64 sum)
  eager     the same fingerprint written with torch ops (bench/torch_signature.py)
  compiled  that torch-ops fingerprint under torch.compile, when it compiles
and prints bandwidths and ratios. Usage: python bench/gpu_signature.py [--gib 1] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_signature  # noqa: E402
from small_call import small_call_us  # noqa: E402

import lm_resiliency  # noqa: E402


def time_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    nbytes = int(args.gib * (1 << 30))
    x = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(x)
    gb = nbytes / 1e9

    expected = torch_signature.content_digest(x)
    assert lm_resiliency.signature(x).content == expected, "CUDA signature differs from the torch reference"

    results = {}
    results["ours"] = time_ms(lambda: lm_resiliency.signature(x), args.iters)
    prepared = lm_resiliency.SignatureSet([x])  # the chunk kernel of the multi-tensor path
    results["set"] = time_ms(lambda: prepared.launch().digests(), args.iters)
    results["copy"] = time_ms(lambda: dst.copy_(x), args.iters)
    results["read"] = time_ms(lambda: x.view(torch.int64).sum(), args.iters)
    results["eager"] = time_ms(lambda: torch_signature.lane_sums(x), max(3, args.iters // 4), warmup=1)
    try:
        compiled = torch.compile(torch_signature.lane_sums_tensor, dynamic=False)
        got = compiled(x)
        assert [int(v) & torch_signature.M32 for v in got.tolist()] == torch_signature.lane_sums(x)
        results["compiled"] = time_ms(lambda: compiled(x), args.iters)
    except Exception as e:  # report, do not hide
        print(f"torch.compile baseline unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    latency_ours, latency_item = small_call_us(torch.device("cuda"))

    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, torch {torch.__version__}, buffer {nbytes / (1 << 30):.2f} GiB")
    print(f"{'path':10s} {'ms':>9s} {'GB/s read':>10s}")
    for name, ms in results.items():
        print(f"{name:10s} {ms:9.3f} {gb / (ms / 1e3):10.1f}")
    copy_read = gb / (results["copy"] / 1e3)
    print(f"copy moves {2 * copy_read:.1f} GB/s (read + write); its read rate is {copy_read:.1f} GB/s")
    print(f"ratio ours / copy read rate      = {results['copy'] / results['ours']:.2f}  (target >= 0.85)")
    print(f"ratio ours / read-only reduction = {results['read'] / results['ours']:.2f}")
    print(f"ratio SignatureSet / read-only reduction = {results['read'] / results['set']:.2f}  (target >= 0.95)")
    print(f"speed-up over torch eager        = {results['eager'] / results['ours']:.1f}x  (target >= 5x)")
    if "compiled" in results:
        print(f"speed-up over torch.compile      = {results['compiled'] / results['ours']:.2f}x")
    print(f"latency of one call on 4 KiB (median of 1000 alternating pairs): ours {latency_ours:.1f} us, "
          f"torch sum().item() {latency_item:.1f} us ({latency_ours / latency_item:.2f}x)")


if __name__ == "__main__":
    main()
