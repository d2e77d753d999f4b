import pytest
import torch

import lm_resiliency as lmr
import torch_signature

ALL_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
    torch.bool, torch.complex64, torch.complex128,
]


def random_tensor(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(torch.tensor(shape).prod()) * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_signs_and_every_bit_flip_changes_it(dtype):
    t = random_tensor((3, 5), dtype)
    base = lmr.signature(t)
    assert len(base.digest) == 16 and len(base.content) == 16 and len(base.meta) == 16
    assert lmr.signature(t.clone()) == base
    raw = t.reshape(-1).view(torch.uint8)
    seen = {base.digest}
    for i in range(raw.numel()):
        for bit in range(8):
            if dtype == torch.bool and bit > 0:
                continue  # bools hold 0 or 1
            flipped = raw.clone()
            flipped[i] ^= 1 << bit
            s = lmr.signature(flipped.view(dtype).reshape(3, 5))
            assert s.content != base.content
            assert s.digest not in seen
            seen.add(s.digest)


def test_content_matches_the_torch_reference():
    for n in [0, 1, 15, 16, 17, 31, 32, 33, 1000, 65536 + 7]:
        t = torch.randint(0, 256, (n,), dtype=torch.uint8)
        assert lmr.signature(t).content == torch_signature.content_digest(t), n


def test_permutation_and_metadata_change_the_digest():
    t = torch.arange(12, dtype=torch.float32)
    s = lmr.signature(t)
    assert lmr.signature(t.flip(0)).digest != s.digest
    assert lmr.signature(t.roll(1)).digest != s.digest
    reshaped = lmr.signature(t.reshape(3, 4))
    assert reshaped.content == s.content and reshaped.digest != s.digest
    assert lmr.signature(t.view(torch.int32)).digest != s.digest


def test_non_contiguous_tensors_are_hashed_in_logical_order():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base.t()
    assert not view.is_contiguous()
    assert lmr.signature(view).content == lmr.signature(view.contiguous()).content
    assert lmr.signature(view).meta != lmr.signature(view.contiguous()).meta  # strides differ
    sliced = base[:, 1::2]
    assert lmr.signature(sliced).content == lmr.signature(sliced.contiguous()).content
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert lmr.signature(z.conj()).content == lmr.signature(z.conj().resolve_conj()).content
    assert lmr.signature(z.conj()).content != lmr.signature(z).content


def test_scalars_and_empty_tensors():
    assert lmr.signature(torch.tensor(1.0)).digest != lmr.signature(torch.tensor([1.0])).digest
    assert lmr.signature(torch.empty(0, 3)).digest != lmr.signature(torch.empty(3, 0)).digest


def test_bad_inputs_get_clear_errors():
    with pytest.raises(lmr.InvalidArgumentError, match="dense tensor"):
        lmr.signature(torch.eye(3).to_sparse())
    with pytest.raises(lmr.InvalidArgumentError, match="torch.Tensor"):
        lmr.signature([1, 2, 3])
    class Wrapped(torch.Tensor):
        pass
    with pytest.raises(lmr.InvalidArgumentError, match="subclass Wrapped"):
        lmr.signature(torch.zeros(3).as_subclass(Wrapped))
    assert lmr.signature(torch.nn.Parameter(torch.ones(3))) == lmr.signature(torch.ones(3))
    with pytest.raises(lmr.UnsupportedError, match="meta"):
        lmr.signature(torch.empty(3, device="meta"))


def test_cuda_request_without_cuda_is_unsupported():
    if torch.cuda.is_available():
        pytest.skip("covered by test_signature_gpu.py")
    assert lmr._core.cuda_available() is False


def test_many_tensors_at_once_equal_one_by_one():
    g = torch.Generator().manual_seed(3)
    base = torch.randint(0, 256, (4096 + 13,), dtype=torch.uint8, generator=g)
    tensors = [random_tensor(shape, dtype, seed=i) for i, (shape, dtype) in enumerate(
        (s, d) for d in ALL_DTYPES for s in [(1,), (7,), (3, 5), (129, 33)])]
    tensors += [base[:0], base[1:18], base[3:3 + 4096], torch.zeros(()), base.view(-1)[::3],
                random_tensor((64, 48), torch.float32).t(), torch.randn(4, 4, dtype=torch.complex64).conj()]
    assert lmr.signatures(tensors) == [lmr.signature(t) for t in tensors]
    assert lmr.signatures([]) == []
    with pytest.raises(lmr.InvalidArgumentError, match="list or tuple"):
        lmr.signatures(torch.zeros(3))
    with pytest.raises(lmr.InvalidArgumentError, match="item 1 needs a torch.Tensor"):
        lmr.signatures([torch.zeros(3), 3])


def test_a_prepared_set_signs_in_place_updates_again_and_again():
    tensors = [random_tensor(shape, dtype, seed=i) for i, (shape, dtype) in enumerate(
        (s, d) for d in ALL_DTYPES for s in [(1,), (3, 5)])] + [torch.zeros(0), torch.zeros(())]
    s = lmr.SignatureSet(tensors)
    assert len(s) == len(tensors) and s.still_valid()
    first = s.launch()
    assert first.ready()
    assert first.signatures() == [lmr.signature(t) for t in tensors]
    assert first.digests() == b"".join(lmr.signature(t).digest for t in tensors)
    tensors[3].view(torch.uint8).view(-1)[0] ^= 1  # an in-place change the next launch sees
    second = s.launch().signatures()
    assert second[3] != first.signatures()[3] and second[3] == lmr.signature(tensors[3])
    assert second[:3] == first.signatures()[:3]
    w = torch.nn.Parameter(torch.randn(4, 4))
    s = lmr.SignatureSet([w])
    w.data = torch.randn(4, 4)  # new storage: the set no longer describes it
    assert not s.still_valid()
    with pytest.raises(lmr.InvalidArgumentError, match="not contiguous"):
        lmr.SignatureSet([torch.randn(4, 4).t()])
    with pytest.raises(lmr.InvalidArgumentError, match="list or tuple"):
        lmr.SignatureSet(torch.zeros(3))
    assert lmr.SignatureSet([]).launch().signatures() == []
