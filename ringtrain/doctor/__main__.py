"""``python -m ringtrain.doctor``: the doctor as a script, for ``ringtrain run`` and jobs."""

import sys

from ringtrain.doctor.cli import main

sys.exit(main(sys.argv[1:]))
