"""``python -m tests.chaos``: the fault harness's command line (``tests.chaos.run``)."""

import sys

from tests.chaos.run import main

sys.exit(main())
