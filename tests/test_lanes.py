"""The test lanes (README): markers registered and strict, the lists in conftest.py naming real tests,
and a fast lane (``pytest -m "not slow"``, light Hypothesis profile) that keeps most of the suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import LANES, MARKERS
from hypothesis import settings

TESTS = Path(__file__).resolve().parent


def test_markers_are_registered_and_strict(request):
    registered = {line.split(":")[0].strip() for line in request.config.getini("markers")}
    assert set(MARKERS) <= registered
    assert request.config.getoption("strict_markers")


def test_the_light_profile_is_registered():
    assert settings.get_profile("dev").max_examples < settings.get_profile("ci").max_examples


def test_the_marker_lists_name_collected_tests(request):
    lanes = request.config.stash[LANES]
    assert not lanes["unused"], f"conftest.py lists tests that do not exist (renamed?): {sorted(lanes['unused'])}"


def test_the_fast_lane_keeps_most_of_the_suite(request):
    lanes = request.config.stash[LANES]
    if lanes["modules"] != {p.name for p in TESTS.glob("test_*.py")}:
        pytest.skip("only part of the suite was collected")
    count = lanes["count"]
    assert count["slow"] > 0 and count["torch"] > 0 and count["subprocess"] > 0
    assert count["all"] - count["slow"] >= 0.75 * count["all"], count
