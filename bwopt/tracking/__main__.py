import sys

from bwopt.tracking.cli import main

sys.exit(main())
