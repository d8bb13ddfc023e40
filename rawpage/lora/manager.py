"""LoRAManager: the adapters the engine knows, and which of them sit in device slots.

At startup (--enable-lora) every q/k/v, o, gate/up and down Linear of the model
becomes a LoRALinear with `--max-loras` slots of rank `--max-lora-rank`
(rawpage/ops/lora.py). The slots never move, so a captured decode graph keeps
reading them; loading an adapter is a copy into a free slot, or into the least
recently used one that no sequence of the step needs. The scheduler keeps the
adapters of the running sequences to at most --max-loras, so a step always fits.

Adapters are known by name (the server's `"model"`) and by id (LoRARequest's
lora_int_id). Unloading forgets the name at once; sequences already running
with the adapter finish with it (they hold the LoRAAdapter) before its slot
is reused. At most --max-cpu-loras adapters are known (their arrays are host
memory): one more forgets the least recently used one that no request is using.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Collection
from collections.abc import Sequence as Seq

import numpy as np

from rawpage.backends.base import Backend
from rawpage.config import ModelConfig
from rawpage.dtypes import from_float32
from rawpage.forward_batch import ForwardBatch
from rawpage.lora.adapter import TARGETS, LoRAAdapter, LoRAError, LoRARequest, load_adapter, projection_shape
from rawpage.ops.lora import LoRABatch, LoRALinear, LoRASlots

logger = logging.getLogger("rawpage")

# The model's fused Linear layers, with their parts in order (rows of the fused weight)
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up": ("gate_proj", "up_proj")}
FUSED["down"] = ("down_proj",)


class LoRAManager:
    def __init__(
        self, model, backend: Backend, max_loras: int, max_rank: int, max_cpu_loras: int | None = None
    ) -> None:
        if max_loras < 1 or max_rank < 1:
            raise ValueError(f"--max-loras and --max-lora-rank must be >= 1, got {max_loras} and {max_rank}")
        self.max_cpu_loras = max_cpu_loras if max_cpu_loras is not None else max(8, max_loras)
        self.config: ModelConfig = model.config
        self.backend, self.max_loras, self.max_rank = backend, max_loras, max_rank
        self.batch = LoRABatch()
        self.slots: dict[tuple[int, str], LoRASlots] = {}  # (layer, fused name) -> slots
        for i, layer in enumerate(model.layers):
            for fused, parts in FUSED.items():
                base = getattr(layer, fused, None)
                if base is None:  # an MoE layer's experts: no adapters there
                    continue
                n_in = projection_shape(self.config, parts[0])[0]
                n_out = sum(projection_shape(self.config, p)[1] for p in parts)
                R = len(parts) * max_rank
                s = LoRASlots(backend.zeros((max_loras, R, n_in)), backend.zeros((max_loras, R, n_out)))
                self.slots[(i, fused)] = s
                setattr(layer, fused, LoRALinear(base, s, self.batch))
        self.adapters: dict[str, LoRAAdapter] = {}  # known by name: --lora-modules, loaded, or requested
        self.resident: OrderedDict[int, LoRAAdapter | None] = OrderedDict((s, None) for s in range(max_loras))
        self.num_evictions = 0
        self._last_used: dict[str, int] = {}  # name -> a use counter's value (LRU of known adapters)
        self._uses = itertools.count()

    @classmethod
    def from_args(cls, args, model, backend: Backend) -> LoRAManager | None:
        """The engine's manager under --enable-lora, with --lora-modules read; else None."""
        if not args.enable_lora:
            return None
        manager = cls(model, backend, args.max_loras, args.max_lora_rank, args.max_cpu_loras)
        for i, (name, path) in enumerate(parse_lora_modules(args.lora_modules)):
            manager.add(LoRARequest(name, i + 1, path))
        logger.info("%s", manager.describe())
        return manager

    def set_batch(self, batch: ForwardBatch) -> None:
        """Before each forward pass: the batch's segments and their slots, for every LoRALinear."""
        self.batch.set(batch.query_start_loc, batch.lora_slots, batch.host_query_lens)

    def slot_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots.values())

    def describe(self) -> str:
        return (
            f"LoRA: {self.max_loras} slots of rank {self.max_rank} on {len(self.slots)} Linear layers, "
            f"{self.slot_bytes() / 2**20:.1f} MiB"
        )

    # --- the adapters known by name ----------------------------------------------------------
    def add(self, request: LoRARequest) -> LoRAAdapter:
        """Read an adapter from disk and know it by name (or return the one already known)."""
        known = self.adapters.get(request.lora_name)
        if known is not None:
            if known.int_id != request.lora_int_id or known.path != request.lora_path:
                raise LoRAError(
                    f"LoRA adapter {request.lora_name!r} is already loaded with id {known.int_id} from "
                    "another folder; unload it first"
                )
            self._last_used[known.name] = next(self._uses)
            return known
        if any(a.int_id == request.lora_int_id for a in self.adapters.values()):
            raise LoRAError(f"LoRA id {request.lora_int_id} is already used by another adapter")
        return self.register(load_adapter(request, self.config, self.max_rank))

    def register(
        self, adapter: LoRAAdapter, in_use: Collection[str] = (), replaces: LoRAAdapter | None = None
    ) -> LoRAAdapter:
        """Engine thread: know an adapter read elsewhere (load_adapter, in a worker thread),
        in place of `replaces` if that is the one known by its name (vLLM's load_inplace;
        requests running with the old one finish with it). Its id is renumbered if another
        took it meanwhile. Past --max-cpu-loras, the least recently used adapter of the same
        owner not named in `in_use` is forgotten: one tenant's loads never forget another's."""
        known = self.adapters.get(adapter.name)
        if known is not None and known is not replaces:
            raise LoRAError(f"The lora adapter '{adapter.name}' has already been loaded")
        for layer, part in adapter.weights:
            if (layer, TARGETS[part][0]) not in self.slots:
                raise LoRAError(f"LoRA adapter {adapter.name!r} adapts {part} of layer {layer}, an MoE layer's experts")
        if known is not None:
            self.remove(known.name)
        if any(a.int_id == adapter.int_id for a in self.adapters.values()):
            adapter.int_id = self.next_id()
        if len(self.adapters) >= self.max_cpu_loras:
            self._evict_idle(in_use, adapter.owner)
        self.adapters[adapter.name] = adapter
        self._last_used[adapter.name] = next(self._uses)
        logger.info(
            "LoRA adapter %r (id %d, rank %d) loaded from %s", adapter.name, adapter.int_id, adapter.rank, adapter.path
        )
        return adapter

    def _evict_idle(self, in_use: Collection[str], owner: str | None) -> None:
        idle = [name for name, a in self.adapters.items() if name not in in_use and a.owner == owner]
        if not idle:
            raise LoRAError(
                f"--max-cpu-loras {self.max_cpu_loras} LoRA adapters are in host memory, and none of "
                "this caller's is idle; unload one, wait, or raise --max-cpu-loras"
            )
        oldest = min(idle, key=lambda name: self._last_used.get(name, -1))
        logger.info("LoRA adapter %r forgotten: --max-cpu-loras %d are loaded", oldest, self.max_cpu_loras)
        self.remove(oldest)

    def remove(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise KeyError(name)
        self._last_used.pop(name, None)
        logger.info("LoRA adapter %r unloaded", name)

    def next_id(self) -> int:
        return max((a.int_id for a in self.adapters.values()), default=0) + 1

    # --- slots ---------------------------------------------------------------------------------
    def activate(self, adapters: Seq[LoRAAdapter | None]) -> np.ndarray:
        """The slot of each sequence's adapter (-1 for none), (B,) int32: adapters not yet
        resident are copied into free slots, or in place of the least recently used ones
        that this step does not need."""
        needed = {id(a): a for a in adapters if a is not None}
        if len(needed) > self.max_loras:
            raise LoRAError(f"a step needs {len(needed)} adapters but --max-loras is {self.max_loras}")
        slot_of = {id(a): s for s, a in self.resident.items() if a is not None and id(a) in needed}
        for s in slot_of.values():
            self.resident.move_to_end(s)  # most recently used last
        for key, adapter in needed.items():
            if key not in slot_of:
                slot_of[key] = self._load(adapter, set(slot_of.values()))
        return np.array([slot_of[id(a)] if a is not None else -1 for a in adapters], np.int32)

    def _load(self, adapter: LoRAAdapter, busy: set[int]) -> int:
        """Copy an adapter into a free slot, else into the least recently used one not in `busy`."""
        free = [s for s, a in self.resident.items() if a is None]
        slot = free[0] if free else next(s for s in self.resident if s not in busy)
        if self.resident[slot] is not None:
            self.num_evictions += 1
            logger.info("LoRA slot %d: evicting %r for %r", slot, self.resident[slot].name, adapter.name)
        R, dtype = self.max_rank, self.backend.dtype
        for (layer, fused), slots in self.slots.items():
            a = np.zeros(slots.a.shape[1:], np.float32)  # (parts * R, in)
            b = np.zeros(slots.b.shape[1:], np.float32)  # (parts * R, out): block-diagonal
            col = 0
            for j, part in enumerate(FUSED[fused]):
                n_out = projection_shape(self.config, part)[1]
                if (layer, part) in adapter.weights:
                    pa, pb = adapter.weights[(layer, part)]  # (r, in), (out, r)
                    a[j * R : j * R + adapter.rank] = pa
                    b[j * R : j * R + adapter.rank, col : col + n_out] = pb.T
                col += n_out
            self.backend.copy_from_host(slots.a[slot], from_float32(a, dtype))
            self.backend.copy_from_host(slots.b[slot], from_float32(b, dtype))
        self.resident[slot] = adapter
        self.resident.move_to_end(slot)
        return slot


def parse_lora_modules(items: Seq[str]) -> list[tuple[str, str]]:
    """--lora-modules name=path ... -> [(name, path)]."""
    pairs = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules takes name=path pairs, got {item!r}")
        pairs.append((name, path))
    return pairs


def resolve_lora(manager: LoRAManager | None, request: LoRARequest | None) -> LoRAAdapter | None:
    """The adapter a request runs with: known by name already, or read from disk now."""
    if request is None:
        return None
    if manager is None:
        raise LoRAError(f"LoRA adapter {request.lora_name!r} asked for, but the engine runs without --enable-lora")
    return manager.add(request)
