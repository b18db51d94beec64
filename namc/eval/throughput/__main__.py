"""``python -m namc.eval.throughput ARGS``: the same as ``namc benchmark ARGS``."""

import sys

from namc.eval.throughput.cli import main

sys.exit(main())
