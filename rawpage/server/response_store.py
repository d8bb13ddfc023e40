"""The Responses API's stored responses (`store: true`, the default, as in OpenAI's API):
what `previous_response_id`, `GET /v1/responses/{id}` and `DELETE` read.

Each response belongs to the API key that made it (its key_id; None on a server without
keys, a single user). Another key's response is reported as not found, the same answer
as for an id that never existed, so ids cannot be probed.

The store is bounded twice, by --responses-store-max-items and --responses-store-max-bytes,
and each key again within that, by --responses-store-max-items-per-key and
--responses-store-max-bytes-per-key (by default an equal share of the whole for each
API key the server knows). A key that is over its quota loses its own least recently
used responses (a read counts as a use), never another key's: one tenant's traffic
cannot evict another's. Where the operator gives quotas that add up to more than the
whole and the whole is full, a new response is returned but not stored. It lives in memory only:
a restart empties it, and a `previous_response_id` from before the restart is a 404,
as is one that was evicted.

A large body's `previous_response_id` is looked up while it is parsed on the preprocessing
threads (ServerState.parse), while the event loop stores and deletes: a lock keeps the
store whole.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class StoredResponse:
    owner: str | None  # the key_id of the key that made it
    response: dict[str, Any]  # the response object, as returned
    history: list[dict[str, Any]]  # the conversation as chat messages, its output included
    nbytes: int  # what it costs against the byte limits


def _size(response: dict[str, Any], history: list[dict[str, Any]]) -> int:
    """The JSON size of what is kept: a close, cheap stand-in for its memory."""
    return len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(history, ensure_ascii=False))


@dataclass
class _Shelf:
    """One key's responses, least recently used first, and what they cost."""

    items: OrderedDict[str, StoredResponse]
    nbytes: int = 0


class ResponseStore:
    """Per key, an LRU map of response id -> StoredResponse, within the key's quota and
    the whole store's count and byte limits."""

    def __init__(
        self, max_items: int, max_bytes: int, max_items_per_key: int | None = None, max_bytes_per_key: int | None = None
    ) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self.max_items_per_key = min(max_items, max_items if max_items_per_key is None else max_items_per_key)
        self.max_bytes_per_key = min(max_bytes, max_bytes if max_bytes_per_key is None else max_bytes_per_key)
        self._shelves: dict[str | None, _Shelf] = {}
        self.count, self.nbytes = 0, 0  # the whole store's
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.count

    def put(self, owner: str | None, response: dict[str, Any], history: list[dict[str, Any]]) -> bool:
        """Store (or replace) a response, evicting the owner's own least recently used ones
        until its quota and the store's limits hold. False if it is not stored: it is larger
        than the owner's byte quota, or the store is full of other keys' responses."""
        item = StoredResponse(owner, response, history, _size(response, history))  # sized outside the lock
        with self._lock:
            return self._put(owner, item)

    def _put(self, owner: str | None, item: StoredResponse) -> bool:
        rid = item.response["id"]
        self._drop(owner, rid)
        if item.nbytes > self.max_bytes_per_key or self.max_items_per_key < 1:
            return False
        shelf = self._shelves.setdefault(owner, _Shelf(OrderedDict()))
        while shelf.items and self._over(shelf, item.nbytes):
            self._drop(owner, next(iter(shelf.items)))
        if self._over(shelf, item.nbytes):  # only other keys' responses are left: they stay
            return False
        shelf.items[rid] = item
        shelf.nbytes += item.nbytes
        self.count, self.nbytes = self.count + 1, self.nbytes + item.nbytes
        return True

    def _over(self, shelf: _Shelf, nbytes: int) -> bool:
        """Would one more response of `nbytes` break the key's quota or the store's limits?"""
        return (
            len(shelf.items) >= self.max_items_per_key
            or shelf.nbytes + nbytes > self.max_bytes_per_key
            or self.count >= self.max_items
            or self.nbytes + nbytes > self.max_bytes
        )

    def get(self, rid: str, owner: str | None) -> StoredResponse | None:
        """The response if it is stored and `owner` made it; a use, for the LRU order."""
        with self._lock:
            shelf = self._shelves.get(owner)
            item = shelf.items.get(rid) if shelf is not None else None
            if item is not None:
                shelf.items.move_to_end(rid)
            return item

    def delete(self, rid: str, owner: str | None) -> bool:
        with self._lock:
            return self._drop(owner, rid)

    def _drop(self, owner: str | None, rid: str) -> bool:
        shelf = self._shelves.get(owner)
        item = shelf.items.pop(rid, None) if shelf is not None else None
        if item is None:
            return False
        shelf.nbytes -= item.nbytes
        self.count, self.nbytes = self.count - 1, self.nbytes - item.nbytes
        if not shelf.items:
            del self._shelves[owner]
        return True
