"""The effective compute multiplier's trend over model sizes, and what it predicts for a size, from curves.csv files.

    .venv/bin/python bench/predict.py results/eval/curves.csv other/results/eval/curves.csv \
        --params 124e6 --tokens-per-param 20

Any experiment's curves (growlm's `results/eval/curves.csv`, a bench script's `bench/results/*_curves.csv`, runs made
on another machine) or comparison.csv files: each arm's multiplier is recomputed from the runs' ends as the
comparison computes it, the trend log m = a + b log N fitted per arm and budget (members counted and free) with its
95% interval over seeds, and read at --params non-embedding parameters and --tokens-per-param, labelled as the
extrapolation it is (growlm.trend, growlm.predict; docs/results.md). `--help` lists the options; a file that is
missing or not a curves table is named in one line.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from growlm.predict import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
