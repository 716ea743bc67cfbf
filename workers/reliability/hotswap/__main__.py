"""``python -m workers.reliability.hotswap``: a replica or the Lighthouse of a hot-swap run (started by
:func:`~workers.reliability.hotswap.run_hot_swap`)."""

import sys

from workers.devices import backend as device_backend
from workers.reliability.hotswap.cli import main

device_backend.prepare_environment()  # before torch is imported (a replica imports it)
sys.exit(main())
