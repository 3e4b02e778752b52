"""Regenerate the course's figures and tables (docs/course/): see cute_kernels/course/__main__.py.

    python3 scripts/course_figures.py --cpu      # here: layouts, analyses, results, SASS
    python3 scripts/course_figures.py --gpu      # on a Hopper GPU: the probes' measurements
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cute_kernels.course.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
