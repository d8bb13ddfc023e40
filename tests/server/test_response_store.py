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
    assert store.nbytes == sum(item.nbytes for shelf in store._shelves.values() for item in shelf.items.values())


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


def test_a_keys_quota_evicts_only_its_own():
    """Issue 44 item 3: B's flood costs B its own oldest responses, never A's."""
    store = ResponseStore(max_items=4, max_bytes=1 << 20, max_items_per_key=2, max_bytes_per_key=1 << 19)
    store.put("a", response(1), [])
    for i in range(100, 200):
        assert store.put("b", response(i), [])
        assert len(store) <= 4
    assert store.get("resp_1", "a") is not None
    assert store.get("resp_198", "b") is not None and store.get("resp_197", "b") is None


def test_a_keys_byte_quota_holds_and_a_full_store_keeps_others():
    store = ResponseStore(max_items=100, max_bytes=4000, max_items_per_key=100, max_bytes_per_key=2000)
    big = "x" * 900
    store.put("a", response(1, big), [])
    store.put("a", response(2, big), [])
    assert store.put("b", response(3, big), []) and store.put("b", response(4, big), [])
    # the whole is full (quotas overcommit it): c's response is not stored, and nobody loses one
    assert not store.put("c", response(5, big), []) and store.get("resp_5", "c") is None
    assert all(store.get(f"resp_{i}", k) for i, k in ((1, "a"), (2, "a"), (3, "b"), (4, "b")))
    assert not store.put("a", response(6, "y" * 2500), [])  # larger than a's byte quota


def test_the_default_quota_is_an_equal_share_per_key():
    from rawpage.server.args import ServerConfig

    config = ServerConfig(api_keys=["k1", "k2", "k3"], admin_api_key="adm", responses_store_max_items=1000)
    assert config.store_quota() == (250, (64 << 20) // 4)
    assert ServerConfig().store_quota() == (1000, 64 << 20)  # no keys: one user has it all
    given = ServerConfig(api_keys=["k1"], responses_store_max_items_per_key=7, responses_store_max_bytes_per_key=9)
    assert given.store_quota() == (7, 9)
