"""The MoE execution-regime catalog through _core (lmr::moe): representatives, coverage,
rotation and the errors a bad shape gets."""

import pytest

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError


def test_catalog_keeps_the_non_dominated_shapes():
    c = _core.MoeCatalog()
    assert c.admit_many([("L0", [2, 2]), ("L0", [1, 2]), ("L0", [3, 0]), ("L0", [2, 2]), ("L1", [1, 1])]) == 4
    assert c.admitted == 4
    assert c.representatives() == [("L0", [2, 2]), ("L0", [3, 0]), ("L1", [1, 1])]
    assert c.uncovered() is None
    assert c.compression == pytest.approx(0.25)
    assert _core.moe_skyline([("L0", [2, 2]), ("L0", [1, 2]), ("L0", [3, 0])]) == [("L0", [2, 2]), ("L0", [3, 0])]
    assert _core.moe_covers(("L0", [2, 2]), ("L0", [1, 2])) and not _core.moe_covers(("L0", [1, 2]), ("L1", [1, 2]))
    assert _core.moe_rotation(2, 5, 2) == [4, 0]


def test_a_negative_count_is_refused_and_changes_nothing():
    c = _core.MoeCatalog()
    c.admit("L0", [1])
    with pytest.raises(InvalidArgumentError, match="negative count -3 on path 0"):
        c.admit("L0", [-3])
    assert c.admitted == 1
