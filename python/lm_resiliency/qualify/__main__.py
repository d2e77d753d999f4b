"""``python -m lm_resiliency.qualify``: the same as ``lmr-qualify``."""

import sys

from lm_resiliency.qualify.runner import main

sys.exit(main())
