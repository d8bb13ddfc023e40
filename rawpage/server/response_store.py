"""The Responses API's stored responses (`store: true`, the default, as in OpenAI's API):
what `previous_response_id`, `GET /v1/responses/{id}` and `DELETE` read.

The store is bounded twice, by --responses-store-max-items and --responses-store-max-bytes,
and evicts the least recently used response first (a read counts as a use), so a server
that answers forever holds a fixed amount of memory. It lives in memory only: a restart
empties it, and a `previous_response_id` from before the restart is a 404, as is one
that was evicted.

Each response belongs to the API key that made it (its key_id; None on a server without
keys, a single user). Another key's response is reported as not found, the same answer
as for an id that never existed, so ids cannot be probed.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class StoredResponse:
    owner: str | None  # the key_id of the key that made it
    response: dict[str, Any]  # the response object, as returned
    history: list[dict[str, Any]]  # the conversation as chat messages, its output included
    nbytes: int  # what it costs against --responses-store-max-bytes


def _size(response: dict[str, Any], history: list[dict[str, Any]]) -> int:
    """The JSON size of what is kept: a close, cheap stand-in for its memory."""
    return len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(history, ensure_ascii=False))


class ResponseStore:
    """An LRU map of response id -> StoredResponse, within a count and a byte limit."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self.nbytes = 0  # the sum of the items' sizes

    def __len__(self) -> int:
        return len(self._items)

    def put(self, owner: str | None, response: dict[str, Any], history: list[dict[str, Any]]) -> bool:
        """Store (or replace) a response, evicting the least recently used ones until both
        limits hold. One larger than the whole byte limit is not stored: False."""
        rid = response["id"]
        self._drop(rid)
        item = StoredResponse(owner, response, history, _size(response, history))
        if item.nbytes > self.max_bytes or self.max_items < 1:
            return False
        while self._items and (len(self._items) >= self.max_items or self.nbytes + item.nbytes > self.max_bytes):
            self._drop(next(iter(self._items)))
        self._items[rid] = item
        self.nbytes += item.nbytes
        return True

    def get(self, rid: str, owner: str | None) -> StoredResponse | None:
        """The response if it is stored and `owner` made it; a use, for the LRU order."""
        item = self._items.get(rid)
        if item is None or item.owner != owner:
            return None
        self._items.move_to_end(rid)
        return item

    def delete(self, rid: str, owner: str | None) -> bool:
        if self.get(rid, owner) is None:
            return False
        self._drop(rid)
        return True

    def _drop(self, rid: str) -> None:
        item = self._items.pop(rid, None)
        if item is not None:
            self.nbytes -= item.nbytes
