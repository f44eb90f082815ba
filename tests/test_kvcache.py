"""The cache tiers without a model: RAM LRU and its bound, the disk tier's files, and every kind of bad file."""

from __future__ import annotations

import errno

import pytest

from edgeinfer.engine.disk import DiskTier
from edgeinfer.engine.kvcache import KvStore

pytestmark = pytest.mark.pure

MiB = 1 << 20


def blob(n: int, fill: int = 7) -> bytes:
    return bytes([fill]) * n


def test_ram_tier_keeps_the_most_recently_used_within_its_bound():
    store = KvStore(ram_bytes=3 * MiB)
    for k in range(3):
        store.put([k] * 20, blob(MiB, k))
    store.get(store.longest([0] * 20)[0])  # touch the oldest: it becomes the most recent
    store.put([9] * 20, blob(MiB, 9))  # one must go: the least recently used is [1]*20
    assert store.longest([1] * 20) == (-1, 0)
    assert all(store.longest([k] * 20)[1] == 20 for k in (0, 2, 9))
    assert store.ram_used == 3 * MiB and store.refresh_stats().ram_evictions == 1


def test_an_entry_is_replaced_by_its_continuation_and_a_contained_prefix_is_not_saved():
    store = KvStore(ram_bytes=10 * MiB)
    store.put([1, 2, 3] * 10, blob(100))
    store.put([1, 2, 3] * 10 + [4, 5], blob(120))  # the next turn of the same conversation
    assert len(store.entries) == 1 and store.ram_used == 120
    store.put([1, 2, 3] * 5, blob(50))  # already held inside the longer entry
    assert len(store.entries) == 1
    key, n = store.longest([1, 2, 3] * 10 + [4, 9])
    assert n == 31 and store.get(key) == blob(120)


def test_an_entry_larger_than_the_ram_budget_is_not_kept():
    store = KvStore(ram_bytes=MiB)
    store.put([1] * 20, blob(2 * MiB))
    assert store.ram_used <= MiB and store.longest([1] * 20) == (-1, 0)


def test_disk_tier_survives_a_restart_and_ram_evictions(tmp_path):
    disk = DiskTier(tmp_path, "model-a", max_bytes=100 * MiB)
    store = KvStore(ram_bytes=2 * MiB, disk=disk)
    for k in range(4):
        store.put([k] * 30, blob(MiB, k))
    disk.flush()
    assert store.refresh_stats().disk_entries == 4 and len(store.ram) == 2
    key, _ = store.longest([0] * 30)  # evicted from RAM, still on disk
    assert store.get(key) == blob(MiB, 0) and store.stats.disk_hits == 1
    store.close()
    again = KvStore(ram_bytes=2 * MiB, disk=DiskTier(tmp_path, "model-a", max_bytes=100 * MiB))
    key, n = again.longest([3] * 30 + [5])
    assert n == 30 and again.get(key) == blob(MiB, 3)
    # Another model's identity is another folder: nothing of model-a's is offered to it.
    other = KvStore(ram_bytes=2 * MiB, disk=DiskTier(tmp_path, "model-b", max_bytes=100 * MiB))
    assert other.longest([3] * 30) == (-1, 0)


def test_disk_tier_stays_within_its_bound_oldest_out(tmp_path):
    disk = DiskTier(tmp_path, "m", max_bytes=3 * MiB)
    store = KvStore(ram_bytes=10 * MiB, disk=disk)
    for k in range(5):
        store.put([k] * 30, blob(MiB, k))
        disk.flush()
    entries, size = disk.counts()
    assert entries == 2 and size <= 3 * MiB  # each file is a little over 1 MiB
    assert sorted(disk.load_index()) == [[3] * 30, [4] * 30]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip a payload byte", "other identity in the header", "not a cache file", "empty"],
)
def test_a_bad_file_is_skipped_with_one_warning_and_removed(tmp_path, damage):
    disk = DiskTier(tmp_path, "m", max_bytes=100 * MiB)
    disk.write([1] * 30, blob(4096, 1))
    disk.write([2] * 30, blob(4096, 2))
    disk.flush()
    path = disk.dir / disk._name([1] * 30)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:-100])
    elif damage == "flip a payload byte":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "other identity in the header":
        path.write_bytes(data.replace(b'"identity": "m"', b'"identity": "x"'))
    elif damage == "not a cache file":
        path.write_bytes(b"hello, this is not a cache file" * 10)
    else:
        path.write_bytes(b"")
    warnings: list[str] = []
    again = DiskTier(tmp_path, "m", max_bytes=100 * MiB, warn=warnings.append)
    index = again.load_index()
    if damage == "flip a payload byte":
        # The header is sound, so the entry is listed; its checksum fails when it is read.
        assert sorted(index) == [[1] * 30, [2] * 30]
        assert again.read([1] * 30) is None
    else:
        assert index == [[2] * 30]
    assert len(warnings) == 1 and "removed" in warnings[0]
    assert not path.exists() and again.read([2] * 30) == blob(4096, 2)


def test_a_full_disk_degrades_to_ram_only_with_one_warning(tmp_path, monkeypatch):
    warnings: list[str] = []
    disk = DiskTier(tmp_path, "m", max_bytes=100 * MiB, warn=warnings.append)
    store = KvStore(ram_bytes=MiB, disk=disk)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("edgeinfer.engine.disk.os.replace", full)
    for k in range(3):
        store.put([k] * 30, blob(100, k))
    disk.flush()
    assert disk.error and len(warnings) == 1 and "No space left" in warnings[0] and "RAM only" in warnings[0]
    assert not list(disk.dir.glob("*.kv")) and not list(disk.dir.glob(".*.tmp"))  # no half-written files
    assert all(store.get(store.longest([k] * 30)[0]) == blob(100, k) for k in range(3))


def test_a_folder_that_cannot_be_made_degrades_to_ram_only_with_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    warnings: list[str] = []
    disk = DiskTier(blocker, "m", max_bytes=MiB, warn=warnings.append)
    store = KvStore(ram_bytes=MiB, disk=disk)
    store.put([1] * 30, blob(100))
    disk.flush()
    assert disk.error and len(warnings) == 1 and "RAM only" in warnings[0]
    assert store.get(store.longest([1] * 30)[0]) == blob(100)
