"""The reference decoder's size as command-line options, shared by the Python benchmarks."""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from lm_resiliency.workloads import DecoderConfig


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)


def reference_job(args: Mapping[str, Any], device: Any) -> tuple[Any, Any, Any]:
    """The reference decoder on `device` (bf16 when args["dtype"] says so), seeded, with AdamW
    and its synthetic tokens: (model, optimizer, data)."""
    import torch

    from lm_resiliency.workloads import Decoder, SyntheticTokens

    torch.manual_seed(0)
    model = Decoder(decoder_config(args)).to(device)
    if args.get("dtype") == "bfloat16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, SyntheticTokens(args["vocab"], args["seq"], args["batch"])


def decoder_config(args: Mapping[str, Any]) -> DecoderConfig:
    return DecoderConfig(vocab_size=args["vocab"], dim=args["dim"], n_layers=args["layers"], n_heads=args["heads"],
                         ffn_hidden=args["dim"] * 8 // 3, max_seq_len=args["seq"])
