"""Java ``ConcurrentHashMap`` iteration order (the broker's offset tables are ConcurrentHashMaps).

fastjson writes a map in its iteration order, so a ``config/*.json`` file the broker persisted lists
``consumerOffset.json``'s ``topic@group`` keys and queue ids in the bin order of the broker's maps.
Modelled here (JDK 8 .. 21 behave the same for what is modelled):

* the table: ``new ConcurrentHashMap()`` starts with 16 bins; ``new ConcurrentHashMap(c)`` with the
  power of two at or above ``c + c/2 + 1`` (JDK 8; later JDKs' ``1 + c/0.75`` gives the same power of
  two for every ``c`` the broker uses: 32, 512);
* a key's bin: ``spread(hashCode) & (bins - 1)``, ``spread(h) = (h ^ (h >>> 16)) & 0x7fffffff``;
  ``String.hashCode`` for strings, the value itself for ``Integer`` keys;
* a new key goes to the end of its bin's list; re-putting a key keeps its place;
* the table doubles once the count reaches ``0.75 * bins`` (``addCount``: ``count >= sizeCtl``, one
  element earlier than ``HashMap``); each bin splits into the lower and the upper half, and the split
  of ``transfer`` keeps the longest tail run of nodes going to the same half in order while the nodes
  before it come out reversed (each is pushed in front of the half's list);
* iteration walks the bins in index order.

A bin of more than 8 keys becomes a tree bin (64 bins or more; a different order) or makes the table
grow by ``tryPresize`` (fewer bins): not modelled, :class:`NotImplementedError` instead of a guess
(offset tables never get near it).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from rmqstore_cli.formats.hashing import java_hash

TREEIFY_THRESHOLD = 8


def java_hash_code(key) -> int:
    """``hashCode()`` of a Java ``String`` or ``Integer``/``Long`` key, as an unsigned 32-bit value."""
    if isinstance(key, str):
        return java_hash(key) & 0xFFFFFFFF
    if isinstance(key, int) and not isinstance(key, bool):
        if -(1 << 31) <= key < (1 << 31):
            return key & 0xFFFFFFFF  # Integer.hashCode
        return (key ^ (key >> 32)) & 0xFFFFFFFF  # Long.hashCode
    raise TypeError(f"no Java hashCode model for {type(key).__name__}")


def spread(h: int) -> int:
    return (h ^ (h >> 16)) & 0x7FFFFFFF


def _table_size_for(c: int) -> int:
    n = 1
    while n < c:
        n <<= 1
    return n


def initial_bins(initial_capacity: int | None) -> int:
    """Bins of ``new ConcurrentHashMap()`` (None) or ``new ConcurrentHashMap(initial_capacity)``."""
    if initial_capacity is None:
        return 16
    return _table_size_for(initial_capacity + (initial_capacity >> 1) + 1)


class ConcurrentHashMapOrder:
    """Key bookkeeping of a ``java.util.concurrent.ConcurrentHashMap`` (single-threaded puts)."""

    def __init__(self, initial_capacity: int | None = None):
        self.bins: list[list] = [[] for _ in range(initial_bins(initial_capacity))]
        self.count = 0

    def _index(self, key, n: int) -> int:
        return spread(java_hash_code(key)) & (n - 1)

    def _transfer(self) -> None:
        n = len(self.bins)
        new: list[list] = [[] for _ in range(2 * n)]
        for i, chain in enumerate(self.bins):
            if not chain:
                continue
            bits = [spread(java_hash_code(k)) & n for k in chain]
            run = len(chain) - 1  # start of the tail run sharing one bit
            while run > 0 and bits[run - 1] == bits[run]:
                run -= 1
            lo = chain[run:] if bits[run] == 0 else []
            hi = chain[run:] if bits[run] else []
            for k, b in zip(chain[:run], bits[:run]):
                if b:
                    hi.insert(0, k)
                else:
                    lo.insert(0, k)
            new[i], new[i + n] = lo, hi
        self.bins = new

    def put(self, key: Hashable) -> None:
        n = len(self.bins)
        chain = self.bins[self._index(key, n)]
        if key in chain:
            return
        chain.append(key)
        if len(chain) > TREEIFY_THRESHOLD:
            # a tree bin (64 bins or more) or tryPresize's growth (fewer): neither is modelled
            raise NotImplementedError("ConcurrentHashMap bins of more than 8 keys are not emulated")
        self.count += 1
        if self.count >= len(self.bins) - (len(self.bins) >> 2):
            self._transfer()

    def keys(self) -> list:
        return [k for chain in self.bins for k in chain]


def concurrent_hashmap_order(keys_in_insertion_order: Iterable, initial_capacity: int | None = None) -> list:
    """Iteration order of a ``ConcurrentHashMap`` after putting these keys in this order."""
    m = ConcurrentHashMapOrder(initial_capacity)
    for k in keys_in_insertion_order:
        m.put(k)
    return m.keys()
