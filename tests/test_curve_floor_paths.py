"""workflow/scripts/curve-floor-paths.py: it reads the default checkout's config the way the
workflow does and refuses, by name, a study checkout without the curve's weights."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "workflow" / "scripts" / "curve-floor-paths.py"


def test_a_study_without_its_weights_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(SCRIPT), str(ROOT), str(tmp_path / "study"),
                          "--out", str(out), "--sizes", "12600"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "the study's weights are missing (run the data-curve study first)" in res.stderr
    # the four drafters of one size, by the paths the study writes
    for name in ("curve-dflash-scaled-12600", "curve-bigram-committed-12600",
                 "curve-ours-scaled-12600", "curve-bigram-12600"):
        assert f"results/smollm2-135m/drafters/{name}/final.pt" in res.stderr
    assert not out.exists()
