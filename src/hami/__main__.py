import sys

from hami.cli import main

sys.exit(main())
