"""README's learning claim: the release check's verdict (bench/learning.py) and the README held to its measurement.

`python -m bench learning --check` runs the default example several times and writes
bench/results/learning-check.json; README.md states what that measured. These tests keep the two together:
a README that claims more than the last check measured, or a check that did not hold, fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.learning import CLAIM, claim_verdict

REPO = Path(__file__).resolve().parent.parent


def run(steps: int | None, minutes: float | None = None) -> dict:
    return {"steps_to_target": steps, "minutes_to_target": minutes if minutes is not None else (steps or 0) / 30}


def test_the_claim_holds_at_its_share_and_fails_below_it() -> None:
    by = CLAIM["by_step"]
    nine = [run(60 + i) for i in range(9)] + [run(None)]
    assert claim_verdict(nine)["holds"] == (CLAIM["share"] <= 0.9)
    eight = [run(60)] * 8 + [run(None), run(by + 1)]  # a run past the claim's step does not count
    verdict = claim_verdict(eight)
    assert verdict["reached"] == 8 and verdict["share"] == 0.8
    assert verdict["holds"] is (CLAIM["share"] <= 0.8)
    assert verdict["line"].startswith("CLAIM FAILS: 8 of 10 runs reached") == (CLAIM["share"] > 0.8)


def test_the_verdict_says_how_fast() -> None:
    line = claim_verdict([run(50, 2.0), run(70, 3.0), run(90, 4.5)])["line"]
    assert "3 of 3 runs reached 0.8 by step 112: steps 50–90 (median 70), 2.0–4.5 min (median 3.0)" in line
    assert not claim_verdict([])["holds"]


def test_the_readme_states_what_the_last_check_measured() -> None:
    results = json.loads((REPO / "bench" / "results" / "learning-check.json").read_text())
    assert results["holds"], f"the last `bench learning --check` did not hold: {results['line']}"
    assert results["claim"] == CLAIM, "bench/learning.py's CLAIM changed since the last check: run it again"
    readme = (REPO / "README.md").read_text()
    stated = re.search(r"reaches ≥ ([0-9.]+) success by step (\d+) in (\d+) of (\d+) runs", readme)
    assert stated, "README.md must state the check's result: 'reaches ≥ 0.8 success by step N in K of M runs'"
    target, step, reached, total = float(stated[1]), int(stated[2]), int(stated[3]), int(stated[4])
    assert (target, step) == (CLAIM["target"], CLAIM["by_step"])
    assert (reached, total) == (results["reached"], len(results["runs"])), "README.md and learning-check.json differ"
    assert total >= 10, "the claim is measured over at least 10 runs"


def test_time_to_quality_counts_runs_that_never_learn_and_compares_with_sync() -> None:
    from bench.to_quality import quality_rows

    def r(steps: int | None, minutes: float | None) -> dict:
        return {"steps_to_target": steps, "minutes_to_target": minutes, "elapsed_s": [30.0 * i for i in range(1, 5)]}

    rows = {
        row["name"]: row
        for row in quality_rows(
            {"batch b0 (sync)": [r(60, 3.0), r(80, 4.0)], "traj b1": [r(70, 2.0), r(None, None), r(50, 1.5)]}
        )
    }
    sync, b1 = rows["batch b0 (sync)"], rows["traj b1"]
    assert sync["reached_share"] == 1.0 and sync["minutes_to_target"] == 3.5 and sync["vs_sync"] == 1.0
    assert b1["reached_share"] == 2 / 3 and b1["each"] == [70, None, 50]  # a run that never learned is counted
    assert b1["steps_to_target"] == 60 and b1["vs_sync"] == 3.5 / 1.75 and b1["s_per_step"] == 30.0


def test_rejudge_keeps_the_runs_and_judges_them_against_the_claim_as_it_is(tmp_path, monkeypatch) -> None:
    import bench.learning as learning

    runs = [run(60)] * 9 + [run(None)]
    old = {**CLAIM, "share": 0.5}
    (tmp_path / "learning-check.json").write_text(json.dumps({"claim": old, "runs": runs, "holds": True}))
    monkeypatch.setattr(learning, "RESULTS", tmp_path)
    code = learning.main(["--rejudge"])
    after = json.loads((tmp_path / "learning-check.json").read_text())
    assert after["runs"] == runs and after["claim"] == CLAIM and after["reached"] == 9
    assert code == (0 if CLAIM["share"] <= 0.9 else 1) and after["holds"] is (code == 0)
    other = {**CLAIM, "by_step": CLAIM["by_step"] + 1}  # another step needs new runs, not a new verdict
    (tmp_path / "learning-check.json").write_text(json.dumps({"claim": other, "runs": runs, "holds": True}))
    assert learning.main(["--rejudge"]) == 2
