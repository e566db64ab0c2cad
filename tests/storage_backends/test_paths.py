"""Key validation and selector rules shared by every backend."""

import pytest

from ckptstore.errors import InvalidStoragePath
from ckptstore.storage_backends.paths import check_key, compile_selector, matches_any


@pytest.mark.parametrize(
    "bad",
    ["..", "../x", "a/../b", "a/..", "/abs", "/", "a\\b", "a\x00b", "a//b", "./a", "a/./b", "C:x"],
)
def test_check_key_rejects_escapes(bad):
    with pytest.raises(InvalidStoragePath, match="Invalid storage key"):
        check_key(bad)


@pytest.mark.parametrize(
    "good, normal",
    [("", ""), ("a", "a"), ("a/b/", "a/b"), ("ünï cödé/ä.txt", "ünï cödé/ä.txt"), ("a..b", "a..b")],
)
def test_check_key_accepts_and_normalizes(good, normal):
    assert check_key(good) == normal


def test_check_key_rejects_non_str_and_required_empty():
    with pytest.raises(InvalidStoragePath):
        check_key(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidStoragePath, match="empty"):
        check_key("", allow_empty=False)


def test_selectors():
    assert compile_selector(None)("anything")
    assert compile_selector("*.keras")("sub/model.keras")
    assert not compile_selector("*.keras")("model.h5")
    pick = compile_selector(["optimizer/", "meta*.json"])
    assert pick("optimizer/state/0.npy") and pick("metadata.json") and not pick("model.keras")
    assert compile_selector(lambda p: p.startswith("a"))("abc")
    assert matches_any("a/b", ["a"])
    with pytest.raises(InvalidStoragePath):
        compile_selector(42)
    with pytest.raises(InvalidStoragePath):
        compile_selector([1, 2])
