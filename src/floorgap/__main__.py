"""``python -m floorgap <stage> ...`` is ``floorgap <stage> ...``."""

import sys

from floorgap.cli import main

if __name__ == "__main__":
    sys.exit(main())
