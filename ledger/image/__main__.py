"""`python -m ledger.image --store DIR [--learn ...]`: the keeper, as `ledger serve --detach` starts it."""

import sys

from ledger.image.server import main

sys.exit(main())
