"""CUDA signatures equal CPU signatures for the same bytes (run on the accelerator)."""

import pytest
import torch

import lm_resiliency as lmr
import torch_signature
from test_signature import ALL_DTYPES, random_tensor

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cuda_equals_cpu_for_every_dtype(dtype):
    for shape in [(1,), (7,), (3, 5), (129, 33)]:
        t = random_tensor(shape, dtype, seed=sum(shape))
        assert lmr.signature(t.cuda()) == lmr.signature(t), (dtype, shape)


def test_cuda_equals_cpu_for_sizes_alignments_and_views():
    g = torch.Generator().manual_seed(1)
    big = torch.randint(0, 256, ((64 << 20) + 13,), dtype=torch.uint8, generator=g)
    gpu = big.cuda()
    for n in [0, 1, 15, 16, 17, 4096, 4097, 1 << 20, (64 << 20) + 13]:
        for offset in [0, 1, 4, 8]:  # unaligned starts take the byte-wise kernel
            if offset + n > big.numel():
                continue
            assert lmr.signature(gpu[offset:offset + n]).content == lmr.signature(big[offset:offset + n]).content
    view = gpu[: 1 << 20].view(torch.float32).reshape(512, 512).t()
    assert lmr.signature(view) == lmr.signature(view.cpu())
    assert lmr.signature(gpu).content == torch_signature.content_digest(gpu)


def test_runs_on_the_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.full((1 << 24,), 3, dtype=torch.int32, device="cuda")
        x.add_(1)  # still queued on `side` when signature() is called
        s = lmr.signature(x)
    assert s == lmr.signature(torch.full((1 << 24,), 4, dtype=torch.int32))


def test_other_device_index_and_core_flag():
    assert lmr._core.cuda_available()
    t = torch.arange(100, dtype=torch.float32, device=f"cuda:{torch.cuda.device_count() - 1}")
    assert lmr.signature(t) == lmr.signature(t.cpu())


def test_many_cuda_tensors_in_one_call_equal_one_by_one():
    g = torch.Generator().manual_seed(5)
    big = torch.randint(0, 256, ((8 << 20) + 13,), dtype=torch.uint8, generator=g)
    gpu = big.cuda()
    tensors = [random_tensor(shape, dtype, seed=i).cuda() for i, (shape, dtype) in enumerate(
        (s, d) for d in ALL_DTYPES for s in [(1,), (7,), (3, 5), (129, 33)])]
    for n in [0, 1, 15, 16, 17, 4096, 4097, 1 << 20, (8 << 20) + 13]:  # sizes across the chunk length
        for offset in [0, 1, 4, 8]:  # unaligned starts
            if offset + n <= big.numel():
                tensors.append(gpu[offset:offset + n])
    tensors.append(gpu[: 1 << 20].view(torch.float32).reshape(512, 512).t())
    got = lmr.signatures(tensors)
    assert got == [lmr.signature(t) for t in tensors]
    assert got == [lmr.signature(t.cpu()) for t in tensors]
    mixed = [tensors[0], tensors[0].cpu(), tensors[5]]  # several devices in one call
    assert lmr.signatures(mixed) == [lmr.signature(t) for t in mixed]


def test_many_run_on_the_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        xs = [torch.full((1 << 22,), 3, dtype=torch.int32, device="cuda") for _ in range(3)]
        for x in xs:
            x.add_(1)  # still queued on `side`
        got = lmr.signatures(xs)
    assert got == [lmr.signature(torch.full((1 << 22,), 4, dtype=torch.int32))] * 3


def test_a_prepared_cuda_set_streams_its_digests():
    tensors = [random_tensor(shape, dtype, seed=i).cuda() for i, (shape, dtype) in enumerate(
        (s, d) for d in ALL_DTYPES for s in [(1,), (129, 33)])]
    tensors += [torch.zeros(0, device="cuda"), torch.zeros((8 << 20) + 5, dtype=torch.uint8, device="cuda")[1:]]
    tensors.append(torch.zeros(3))  # a host tensor in the same set
    s = lmr.SignatureSet(tensors)
    expected = [lmr.signature(t) for t in tensors]
    big = tensors[-2]  # zeros on the device
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the launch queues behind this on the current stream
        pending = s.launch()
        assert not pending.ready()
        big.add_(1)  # after the launch in stream order: not in its digests
    got = pending.signatures()  # waits for this launch only
    assert got == expected
    torch.cuda.synchronize()
    again = s.launch().signatures()
    assert again == [lmr.signature(t) for t in tensors] and again[-2] != expected[-2]
