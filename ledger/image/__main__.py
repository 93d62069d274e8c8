"""`python -m ledger.image`: the keeper, as `ledger serve --detach` starts it (options as JSON on stdin)."""

import sys

from ledger.image.keeper import main

sys.exit(main())
