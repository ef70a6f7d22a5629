"""Atomic writes (tag._atomic): the contents replace the target only on success, with the permissions a
plain write would give."""

from __future__ import annotations

import os

import pytest

from tag._atomic import atomic_open, atomic_write_text


def test_a_new_file_gets_the_umask_s_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    previous = os.umask(0o022)
    try:
        fresh = tmp_path / "plan.json"
        atomic_write_text(fresh, "{}")
        assert fresh.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.json", "{}")
        assert (tmp_path / "private.json").stat().st_mode & 0o777 == 0o600
        fresh.chmod(0o640)
        atomic_write_text(fresh, '{"a": 1}')
        assert fresh.stat().st_mode & 0o777 == 0o640 and fresh.read_text() == '{"a": 1}'
    finally:
        os.umask(previous)


def test_a_failed_write_leaves_the_target_and_no_temporary(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half-way"):
        with atomic_open(target) as handle:
            handle.write(b"new")
            raise RuntimeError("half-way")
    assert target.read_text() == "old"
    assert not list(tmp_path.glob(".*.tmp"))
