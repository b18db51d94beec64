"""``python -m namc``: the ``namc`` console script."""

import sys

from namc.cli import main

sys.exit(main())
