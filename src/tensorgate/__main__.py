import sys

from tensorgate.cli import main

sys.exit(main())
