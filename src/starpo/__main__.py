import sys

from starpo.cli import main

sys.exit(main())
