"""``python -m floorgap <stage> ...`` is ``floorgap <stage> ...``."""

import sys

from floorgap.cli import main

sys.exit(main())
