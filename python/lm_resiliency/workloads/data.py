"""Deterministic synthetic tokens with structure a small model can learn: each sequence
follows a fixed random successor table, with a fraction of tokens replaced by noise.
Batch (step, shard) is the same on every machine and run."""

from __future__ import annotations

import torch


class SyntheticTokens:
    def __init__(self, vocab_size: int, seq_len: int, batch_size: int, seed: int = 0, noise: float = 0.1) -> None:
        if vocab_size < 2 or seq_len < 1 or batch_size < 1:
            raise ValueError("SyntheticTokens needs vocab_size >= 2, seq_len >= 1, batch_size >= 1")
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {noise}")
        self.vocab_size, self.seq_len, self.batch_size, self.seed, self.noise = (
            vocab_size, seq_len, batch_size, seed, noise)
        g = torch.Generator().manual_seed(seed)
        self.successor = torch.randperm(vocab_size, generator=g)

    def _generator(self, step: int, shard: int) -> torch.Generator:
        # A fixed mixing of (seed, step, shard) into a 63-bit seed.
        key = (self.seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + shard * 0x94D049BB133111EB + 1)
        key ^= key >> 31
        return torch.Generator().manual_seed(key & ((1 << 63) - 1))

    def batch(self, step: int, shard: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of shape (batch_size, seq_len), int64, on CPU."""
        g = self._generator(step, shard)
        seq = torch.empty(self.batch_size, self.seq_len + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(0, self.vocab_size, (self.batch_size,), generator=g)
        noise = torch.rand(self.batch_size, self.seq_len, generator=g) < self.noise
        random_tokens = torch.randint(0, self.vocab_size, (self.batch_size, self.seq_len), generator=g)
        for t in range(self.seq_len):
            nxt = self.successor[seq[:, t]]
            seq[:, t + 1] = torch.where(noise[:, t], random_tokens[:, t], nxt)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class Position:
    """Batches consumed: the data position a checkpoint holds (a ``state_dict`` object for
    the checkpoint's ``data_state``)."""

    def __init__(self) -> None:
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consumed = int(state["consumed"])
