import sys

from draftrl.cli import main

sys.exit(main())
