"""``python -m hami_devkit ...``: the same command line as the ``hami-dev`` script."""

import sys

from hami_devkit.command import main

if __name__ == "__main__":
    sys.exit(main())
