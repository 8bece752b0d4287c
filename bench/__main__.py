"""``python -m bench`` (see bench/__init__.py)."""

import sys

from .run import main

sys.exit(main())
