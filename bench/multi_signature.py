"""Many tensors fingerprinted at once, side by side in one run: the reference decoder's live
parameters and gradients signed one by one (``signature()`` per tensor), all at once
(``signatures()``: one launch, one read-back on CUDA), a ``SignatureSet`` prepared once
and launched again (what state integrity does every step), torch's multi-tensor reduction over
the same tensors (``torch._foreach_norm``, read-only, one wait), and one flat buffer of the
same size (``signature()`` once). Also one 4 KiB call against ``sum().item()``.

    python bench/multi_signature.py                                  # CPU, a small model
    python3 bench/multi_signature.py --device cuda --layers 16 --dim 2048 --dtype bfloat16

Prints GB/s (median of --repeats) and ratios to signatures().
"""

import argparse
import statistics
import time

import torch

import lm_resiliency as lmr
from lm_resiliency.workloads.model import Decoder, DecoderConfig
from small_call import small_call_us


def timed(fn, repeats, device):
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = Decoder(DecoderConfig(dim=args.dim, n_layers=args.layers, n_heads=16 if args.dim >= 1024 else 8,
                                  ffn_hidden=args.dim * 8 // 3 // 64 * 64, vocab_size=32000, max_seq_len=64))
    model = model.to(device=device, dtype=dtype)
    for q in model.parameters():
        q.grad = torch.randn_like(q)
    tensors = [q.detach() for q in model.parameters()] + [q.grad for q in model.parameters()]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    assert lmr.signatures(tensors) == [lmr.signature(t) for t in tensors]  # the same digests
    prepared = lmr.SignatureSet(tensors)
    assert prepared.launch().signatures() == lmr.signatures(tensors)
    rows = {
        "SignatureSet (prepared once)": timed(lambda: prepared.launch().digests(), args.repeats, device),
        "signatures(), all at once": timed(lambda: lmr.signatures(tensors), args.repeats, device),
        "signature() per tensor": timed(lambda: [lmr.signature(t) for t in tensors], args.repeats, device),
        "torch._foreach_norm, one wait": timed(lambda: torch._foreach_norm(tensors), args.repeats, device),
        "signature() of one flat buffer": timed(lambda: lmr.signature(flat), args.repeats, device),
    }
    one, item = small_call_us(device)
    base = rows["signatures(), all at once"]
    print(f"{len(tensors)} tensors ({nbytes / 2**30:.2f} GiB, {args.dtype}) on {args.device}, median of "
          f"{args.repeats}:")
    for name, seconds in rows.items():
        print(f"  {name:34s} {nbytes / seconds / 1e9:9.1f} GB/s  {seconds * 1e3:9.2f} ms  "
              f"{seconds / base:6.2f}x the time of signatures()")
    print(f"  one 4 KiB signature()            {one:9.1f} us against sum().item() {item:.1f} us "
          f"({one / item:.2f}x; medians of 1000 alternating pairs)")


if __name__ == "__main__":
    main()
