"""`python -m rawpage`: the `rawpage` command (serve, generate, chat, bench), for when the
console script is not on PATH."""

import sys

from rawpage.cli import main

sys.exit(main())
