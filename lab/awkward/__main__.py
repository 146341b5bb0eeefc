"""python -m lab.awkward: the awkward-input sweep (sweep.py)."""
import sys

from lab.awkward.sweep import main

sys.exit(main())
