"""``python -m raylog.actors.cli``: the ``raylog`` command."""

import sys

from raylog.actors.cli.main import main

sys.exit(main())
