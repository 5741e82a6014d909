"""The job table: every stable name points at a real function, every old path at the same one."""

from __future__ import annotations

import os

import pytest

from app.queues import BORN_STABLE, JOBS, LEGACY_NAMES, job_function, job_name


@pytest.mark.parametrize("name", sorted(JOBS))
def test_each_stable_name_resolves_to_the_function_its_path_names(name: str) -> None:
    function = job_function(name)
    assert name.startswith("kurir.")
    assert f"{function.__module__}.{function.__qualname__}" == JOBS[name]


@pytest.mark.parametrize("old", sorted(LEGACY_NAMES))
def test_each_old_path_runs_the_function_of_its_stable_name(old: str) -> None:
    assert job_name(old) == LEGACY_NAMES[old]
    assert job_function(old) is job_function(LEGACY_NAMES[old])


def test_every_stable_name_keeps_an_alias_for_jobs_queued_before_it() -> None:
    assert sorted(LEGACY_NAMES.values()) == sorted(set(JOBS) - BORN_STABLE)


def test_other_names_are_imported_as_rq_would() -> None:
    assert job_name("os.getcwd") == "os.getcwd"
    assert job_function("os.getcwd") is os.getcwd
