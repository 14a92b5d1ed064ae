"""The suite's order (conftest.pytest_collection_modifyitems): the long tests first, the longest first, and the
others in the order they were collected."""

from __future__ import annotations

from .conftest import run_order


def test_long_tests_run_first_longest_first(request):
    items = request.session.items
    keys = [run_order(i) for i in items]
    assert keys == sorted(keys)
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    assert items[: len(slow)] == slow
    rest = items[len(slow):]
    files = [str(i.path) for k, i in enumerate(rest) if k == 0 or i.path != rest[k - 1].path]
    assert len(files) == len(set(files))  # the other tests stay file by file, as collected
