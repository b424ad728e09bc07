import sys

from asymo.cli import main

sys.exit(main())
