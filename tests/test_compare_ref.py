"""benchmarks/compare_ref.py's pure parts: step times from metric rows of either naming, the export."""

from __future__ import annotations

import math

from benchmarks.compare_ref import StepTimes, export_ref, per_token, step_times


def test_step_times_are_wall_time_differences_after_the_first_step():
    rows = [
        {"step": 1, "wall_time": 10.0, "train/forward_positions": 900, "train/tokens": 90},
        {"step": 2, "wall_time": 12.5, "train/forward_positions": 800, "train/tokens": 100},
        {"step": 3, "wall_time": 16.0, "train/forward_positions": 600, "train/tokens": 150},
    ]
    times = step_times(rows)
    assert times.seconds == [2.5, 3.5]
    assert times.positions == [800, 600] and times.tokens == [100, 150]
    assert per_token(times) == "6.00"  # median of 8.0 and 4.0


def test_rows_before_the_metric_namespaces_are_read_too():
    rows = [
        {"step": 1, "wall_time": 1.0, "forward_positions": 10, "train_tokens": 5},
        {"step": 2, "wall_time": 3.0, "forward_positions": 30, "train_tokens": 10},
    ]
    times = step_times(rows)
    assert times.seconds == [2.0] and per_token(times) == "3.00"


def test_a_run_without_the_sizes_says_so():
    times = step_times([{"step": 1, "wall_time": 1.0}, {"step": 2, "wall_time": 2.0}])
    assert math.isnan(times.positions[0]) and per_token(times) == "-"
    assert per_token(StepTimes([1.0], [10.0], [0.0])) == "-"


def test_export_ref_unpacks_the_refs_tracked_files(tmp_path):
    code = export_ref("HEAD", tmp_path)
    assert (code / "looprl" / "__init__.py").is_file()
    assert (code / "benchmarks" / "train_step.py").is_file()
