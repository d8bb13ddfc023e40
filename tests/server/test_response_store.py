"""ResponseStore (issue 33): bounded by count and bytes, least recently used out first,
one key's responses invisible to another, and nothing survives a restart."""

from rawpage.server.response_store import ResponseStore


def response(i: int, text: str = "x" * 200) -> dict:
    return {"id": f"resp_{i}", "object": "response", "output": [{"type": "message", "content": text}]}


def test_the_byte_limit_holds_under_a_thousand_responses():
    store = ResponseStore(max_items=10_000, max_bytes=20_000)
    for i in range(1000):
        assert store.put("k", response(i), [{"role": "user", "content": f"q{i}"}])
        assert store.nbytes <= 20_000
    assert 0 < len(store) < 1000 and store.get("resp_999", "k") is not None
    assert store.get("resp_0", "k") is None  # the oldest went first
    assert store.nbytes == sum(item.nbytes for item in store._items.values())


def test_the_count_limit_evicts_the_least_recently_used():
    store = ResponseStore(max_items=2, max_bytes=1 << 20)
    store.put(None, response(1), [])
    store.put(None, response(2), [])
    assert store.get("resp_1", None) is not None  # a read is a use: resp_2 is now the oldest
    store.put(None, response(3), [])
    assert store.get("resp_2", None) is None and store.get("resp_1", None) is not None


def test_one_too_large_for_the_whole_limit_is_not_stored():
    store = ResponseStore(max_items=10, max_bytes=100)
    assert not store.put(None, response(1), []) and len(store) == 0


def test_another_key_sees_nothing_and_cannot_delete():
    store = ResponseStore(max_items=10, max_bytes=1 << 20)
    store.put("key-a", response(1), [])
    assert store.get("resp_1", "key-b") is None and store.get("resp_1", None) is None
    assert not store.delete("resp_1", "key-b")
    assert store.delete("resp_1", "key-a") and store.get("resp_1", "key-a") is None and store.nbytes == 0


def test_a_restart_empties_it():
    """The store lives in memory: a new server process starts with a new, empty store."""
    store = ResponseStore(max_items=10, max_bytes=1 << 20)
    store.put(None, response(1), [])
    assert len(ResponseStore(max_items=10, max_bytes=1 << 20)) == 0
