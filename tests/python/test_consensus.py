import lm_resiliency as lmr
from lm_resiliency import Status


def test_exact_attributes_the_minority_and_maps_ranks():
    r = lmr.exact([b"d", b"d", b"x", b"d", b"d"], [10, 11, 12, 13, 14])
    assert r.status == Status.Attributed
    assert r.bitmap == [False, False, True, False, False]
    assert r.attributed_ranks == [12]
    assert r.evidence == [b"d", b"d", b"x", b"d", b"d"]
    assert r.majority_count == 4


def test_exact_agree_and_inconclusive():
    assert lmr.exact([b"a"] * 4).status == Status.Agree
    assert lmr.exact([b"a", b"b"]).status == Status.Inconclusive
    tie = lmr.exact([b"a", b"a", b"b", b"b"])
    assert tie.status == Status.Inconclusive and tie.attributed_ranks == []


def test_timing_options_and_result():
    opts = lmr.TimingOptions(kappa=4.0, absolute_threshold=0.01, relative_threshold=0.1)
    r = lmr.timing([0.10, 0.10, 0.30, 0.10], opts, [4, 5, 6, 7])
    assert r.status == Status.Attributed and r.attributed_ranks == [6]
    assert abs(r.median - 0.10) < 1e-12
    assert lmr.timing([0.10, 0.10, 0.105, 0.10], opts).status == Status.Agree
    assert lmr.timing([0.1, 0.9]).status == Status.Inconclusive
