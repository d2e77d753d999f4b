"""Captured block arguments are isolated for replay, closures included: TorchTitan hands
each block a flex-attention BlockMask whose ``mask_mod`` closes over the batch's
document positions, so peers replaying the source's input must also use its mask."""

import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import and_masks

from lm_resiliency.scout.arguments import isolate, leaves, map_tensors


def _document_mask(positions):
    def same_document(b, h, q, kv):
        return positions[b, q] >= positions[b, kv]

    return same_document


def _causal(b, h, q, kv):
    return q >= kv


def _at(q, kv):
    return torch.tensor(0), torch.tensor(0), torch.tensor(q), torch.tensor(kv)


def test_a_closure_over_tensors_is_rebuilt_around_copies():
    positions = torch.tensor([[0, 1, 2, 0]])
    mask_mod = and_masks(_causal, _document_mask(positions))
    assert [t.data_ptr() for t in leaves(mask_mod)] == [positions.data_ptr()]

    copy = isolate(mask_mod)
    inner = leaves(copy)
    assert len(inner) == 1 and inner[0].data_ptr() != positions.data_ptr() and torch.equal(inner[0], positions)
    positions.zero_()  # the live batch moves on: the copy keeps what was captured
    assert bool(copy(*_at(3, 2))) is False
    assert bool(mask_mod(*_at(3, 2))) is True

    # What a peer receives from the replay source replaces the tensors inside the closure.
    theirs = map_tensors(mask_mod, lambda t: torch.tensor([[0, 1, 2, 3]]))
    assert bool(theirs(*_at(3, 2))) is True


def test_a_closure_without_data_is_shared_and_a_module_in_one_stays_shared():
    assert isolate(_causal) is _causal
    offset = 3

    def shifted(b, h, q, kv):
        return q + offset >= kv

    assert isolate(shifted) is shifted

    layer = nn.Linear(2, 2)

    def uses_module(x):
        return layer(x)

    assert isolate(uses_module) is uses_module  # a module cannot be copied: shared, as before
    assert leaves(uses_module) == []
