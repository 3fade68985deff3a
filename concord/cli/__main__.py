"""``python -m concord.cli``: the same as the ``concord`` command."""

import sys

from concord.cli import main

sys.exit(main())
