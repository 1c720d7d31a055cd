"""`python -m oxla` is the `oxla` command."""

from __future__ import annotations

import sys

from oxla.cli import main

sys.exit(main())
