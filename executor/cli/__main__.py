"""`python -m executor.cli …` runs the `toolfence` command."""

import sys

from executor.cli.main import main

sys.exit(main())
