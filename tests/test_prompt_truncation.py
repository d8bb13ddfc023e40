"""vLLM's truncate_prompt_tokens and truncation_side as one pure function (issue 42)."""

import pytest

from rawpage.prompt_truncation import resolve, truncate

IDS = list(range(10))


@pytest.mark.parametrize(
    ("keep", "side", "want"),
    [(4, "left", IDS[-4:]), (4, "right", IDS[:4]), (10, "left", IDS), (12, "right", IDS), (0, "left", [])],
)
def test_truncate_keeps_the_side_asked(keep, side, want):
    assert truncate(IDS, keep, side) == want


def test_resolve_maps_minus_one_to_the_room_left_and_refuses_more():
    assert resolve(-1, "left", 100, "max_model_len - max_tokens").keep == 100
    assert resolve(7, "right", 100, "max_model_len - max_tokens").apply(IDS) == IDS[:7]
    with pytest.raises(ValueError, match=r"cannot be greater than max_model_len - max_tokens = 100"):
        resolve(101, "left", 100, "max_model_len - max_tokens")
    with pytest.raises(ValueError, match="greater_than_equal"):
        resolve(-2, "left", 100, "x")
    with pytest.raises(ValueError, match="truncation_side"):
        resolve(3, "middle", 100, "x")
    with pytest.raises(ValueError, match="leaves no room"):
        resolve(-1, "left", 0, "max_model_len - max_tokens")
