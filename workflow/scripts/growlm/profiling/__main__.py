"""`python -m growlm.profiling TOOL OUT_DIR ...`: see `growlm.profiling.driver`."""

import sys

from growlm.profiling.driver import main

sys.exit(main())
